"""Wikipedia editions to the language codes used everywhere in the project (fastText lid.176's).

lid.176's labels are ISO 639-1 where a code exists (`de`, `zh`) and otherwise mostly the Wikipedia
edition codes it was trained on (`als`, `arz`, `yue`, `sh`). An edition outside lid.176's label set
keeps its own code when that is an ISO 639-3 code (`ltg`, `szl`, `gan`); a few Wikipedia-specific
edition codes are mapped to the language they are written in (`simple` -> `en`, `zh-yue` -> `yue`).
"""
from __future__ import annotations

import re
from urllib.parse import urlparse

# The 176 labels of fastText's lid.176 model (without the "__label__" prefix).
LID176_LABELS = frozenset(
    """af als am an ar arz as ast av az azb ba bar bcl be bg bh bn bo bpy br bs bxr ca cbk ce ceb ckb
    co cs cv cy da de diq dsb dty dv el eml en eo es et eu fa fi fr frr fy ga gd gl gn gom gu gv he hi
    hif hr hsb ht hu hy ia id ie ilo io is it ja jbo jv ka kk km kn ko krc ku kv kw ky la lb lez li lmo
    lo lrc lt lv mai mg mhr min mk ml mn mr mrj ms mt mwl my myv mzn nah nap nds ne new nl nn no oc or
    os pa pam pfl pl pms pnb ps pt qu rm ro ru rue sa sah sc scn sco sd sh si sk sl so sq sr su sv sw ta
    te tg th tk tl tr tt tyv ug uk ur uz vec vep vi vls vo wa war wuu xal xmf yi yo yue zh""".split()
)

# Edition codes that are not the language's ISO code (subdomain form, with hyphens).
EDITION_TO_LANG = {
    "simple": "en",  # Simple English
    "zh-yue": "yue",  # Cantonese
    "zh-min-nan": "nan",  # Min Nan
    "zh-classical": "lzh",  # Classical Chinese
    "be-tarask": "be",  # Belarusian (Taraškievica orthography)
    "be-x-old": "be",
    "bat-smg": "sgs",  # Samogitian
    "fiu-vro": "vro",  # Võro
    "roa-rup": "rup",  # Aromanian
    "roa-tara": "nap",  # Tarantino, a Neapolitan variety (no ISO 639-3 code of its own)
    "map-bms": "jv",  # Banyumasan, a Javanese dialect
    "nds-nl": "nds",  # Dutch Low Saxon
    "cbk-zam": "cbk",  # Chavacano
    "nb": "no",  # lid.176 labels Norwegian Bokmål "no"
    "mo": "ro",  # Moldovan (closed edition)
    "zh-wuu": "wuu",
    "fil": "tl",
    "tgl": "tl",
    "in": "id",  # legacy ISO 639-1 codes
    "iw": "he",
    "ji": "yi",
    "jw": "jv",
}

# Project suffixes of MediaWiki database names, longest first ("enwikisource" is not "enwiki").
_DB_SUFFIXES = ("wikivoyage", "wikisource", "wikiquote", "wikibooks", "wikinews", "wikiversity", "wiktionary", "wiki")
_CODE = re.compile(r"^[a-z]{2,3}(-[a-z0-9]+)*$")


def edition_to_lang(edition: str) -> str | None:
    """An edition code (`en`, `zh-yue`, `zh_yue`) or database name (`enwiki`, `zh_yuewiki`) to a
    lid.176-style code; None when the input is not a recognisable edition."""
    code = edition.strip().lower().replace("_", "-")
    for suffix in _DB_SUFFIXES:
        if code.endswith(suffix) and len(code) > len(suffix):
            code = code[: -len(suffix)]
            break
    code = code.rstrip("-")
    if code in EDITION_TO_LANG:
        return EDITION_TO_LANG[code]
    if code in LID176_LABELS:
        return code
    if not _CODE.match(code):
        return None
    return code


def edition_from_url(url: str) -> str | None:
    """`https://zh-yue.wikipedia.org/wiki/Main_Page` -> `yue`."""
    host = urlparse(url).hostname or ""
    parts = host.split(".")
    if len(parts) >= 3 and parts[-2] in ("wikipedia", "wiktionary", "wikisource", "wikibooks", "wikinews", "wikiquote", "wikivoyage", "wikiversity"):
        return edition_to_lang(parts[0])
    return None


def is_interlanguage_prefix(prefix: str) -> bool:
    """Whether `prefix` in `[[prefix:Title]]` names another Wikipedia edition (an interlanguage link)."""
    code = prefix.strip().lower()
    return code in EDITION_TO_LANG or code in LID176_LABELS or bool(re.fullmatch(r"[a-z]{2,3}(-[a-z]+){0,2}", code))
