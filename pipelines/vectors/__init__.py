"""labse-embed: sentences embedded once per language into saved vectors (`vectors:DIR`)."""
