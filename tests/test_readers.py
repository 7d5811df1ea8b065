"""Readers on the real samples and on hand-made bad inputs (generated here, not committed)."""
from __future__ import annotations

import bz2
import gzip
import io
import zlib
from collections import Counter
from pathlib import Path

import pytest

from pipelines.io.documents import Document, Dropped, ReaderLimits, ReadError
from pipelines.read.readers import check_pattern_matches, read_records
from tests.conftest import require_file

CC_SAMPLE = "commoncrawl/CC-MAIN-2020-34-sample.warc.gz"
WEB_PAGES = "commoncrawl/web-pages-sample.warc.gz"
ENWIKI = "wikipedia/enwiki-pages-articles-sample.xml.bz2"
LTGWIKI = "wikipedia/ltgwiki-pages-articles-sample.xml.bz2"


# ---------------------------------------------------------------- builders for hand-made inputs
def http_block(body: bytes, content_type: str = "text/html; charset=utf-8", extra: str = "", status: str = "200 OK") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
    return head.encode("latin-1") + body


def warc_record(
    block: bytes,
    warc_type: str = "response",
    uri: str = "http://example.com/",
    record_id: str = "<urn:uuid:00000000-0000-0000-0000-000000000000>",
    version: str = "WARC/1.0",
    content_length: str | None = None,
    content_type: str = "application/http; msgtype=response",
) -> bytes:
    length = str(len(block)) if content_length is None else content_length
    head = (
        f"{version}\r\nWARC-Type: {warc_type}\r\nWARC-Record-ID: {record_id}\r\n"
        f"WARC-Date: 2020-08-01T00:00:00Z\r\nWARC-Target-URI: {uri}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {length}\r\n\r\n"
    )
    return head.encode("utf-8") + block + b"\r\n\r\n"


def page(i: int) -> bytes:
    return f"<html><head><title>page {i}</title></head><body><p>Paragraph {i} of a test page.</p></body></html>".encode()


def good_records(n: int, start: int = 0) -> list[bytes]:
    return [
        warc_record(http_block(page(i)), uri=f"http://example.com/{i}", record_id=f"<urn:uuid:{i:08d}-0000-0000-0000-000000000000>")
        for i in range(start, start + n)
    ]


def gz_members(records: list[bytes]) -> bytes:
    return b"".join(gzip.compress(r) for r in records)


def read_all(path, fmt="warc", **kwargs):
    stats = Counter()
    results = list(read_records(str(path), fmt, stats=stats, **kwargs))
    return results, stats


def split(results):
    docs = [r for r in results if isinstance(r, Document)]
    dropped = Counter(r.reason for r in results if isinstance(r, Dropped))
    errors = [r for r in results if isinstance(r, ReadError)]
    return docs, dropped, errors


# ---------------------------------------------------------------- real data: WARC
def test_cc_sample_yields_decoded_chinese_and_russian_html(labse_data):
    path = require_file(labse_data, CC_SAMPLE)
    results, stats = read_all(path)
    docs, dropped, errors = split(results)
    # The sample's README: 1 warcinfo, 17 request, 16 response, 16 metadata records.
    assert len(results) == 50
    assert len(docs) == 16 and not errors
    assert dropped == {"warc_type:request": 17, "warc_type:metadata": 16, "warc_type:warcinfo": 1}
    assert all(d.kind == "html" and d.source == "cc" and d.lang is None for d in docs)
    assert all(d.doc_id.startswith("<urn:uuid:") and d.url.startswith("http") for d in docs)
    assert len({d.offset for d in docs}) == 16  # one gzip member per record
    by_url = {d.url: d.body for d in docs}
    # windows-1251 declared in the HTTP header: Cyrillic must come out as Cyrillic.
    assert "О компании - Стратегия пожарной безопасности" in by_url["http://01spb.ru/company/"]
    # gb2312 declared: decoded with its WHATWG superset gbk.
    chinese = [body for body in by_url.values() if "主页" in body]
    assert len(chinese) >= 2
    assert not any("\ufffd" in body[:2000] for body in by_url.values())


def test_the_mojibake_chinese_of_the_cc_sample_is_in_the_page_itself(labse_data):
    # 003338.cn declares UTF-8 in <meta> and its bytes are valid UTF-8; the garbled keyword
    # (UTF-8 of "澳洲28是不是正规的" read as GBK, with bytes lost as "?") is in the page as sent,
    # even as numeric character references in its <title>, which no byte decoding could produce.
    path = require_file(labse_data, CC_SAMPLE)
    docs, _dropped, _errors = split(read_all(path)[0])
    body = next(d.body for d in docs if d.url == "http://003338.cn/l41/481397.html")
    assert "<title>&#x5a62;&#x866b;&#x5e8a;" in body
    assert "包括婢虫床28鏄?笉鏄??瑙勭殑最新同义词" in body
    assert "我国卫生与健康领域有了“基本法”" in body


def test_valid_utf8_wins_over_a_wrong_detection_on_a_real_page(labse_data):
    # No charset in the HTTP header or the first 4 KiB; uchardet calls this page windows-1252,
    # which turned every em dash into "â€”". Its bytes are valid UTF-8, so UTF-8 it is.
    path = require_file(labse_data, "maincontent/article-pages.warc.gz")
    url = "https://www.cnbc.com/2019/11/20/emirates-inks-order-for-30-boeing-787-jets-talks-expansion-plans.html"
    stats = Counter()
    body = next(r.body for r in read_records(str(path), "warc", stats=stats) if getattr(r, "url", None) == url)
    assert "DUBAI, United Arab Emirates — Dubai's flagship carrier" in body
    assert "â€" not in body and "Â©" not in body
    assert stats["charset_utf8"] >= 1


def test_valid_utf8_wins_over_a_declared_legacy_charset():
    from pipelines.read.payload import decode_html_bytes

    text = "<html><head><meta charset=gb2312></head><body><p>人工智能</p><p>关于我们</p></body></html>"
    # A stale legacy label on UTF-8 bytes: gbk "decodes" them into mojibake without an error.
    assert "<p>浜哄伐鏅鸿兘</p><p>鍏充簬鎴戜滑</p>" in text.encode("utf-8").decode("gbk")
    assert decode_html_bytes(text.encode("utf-8"), None) == (text, "utf8")
    assert decode_html_bytes(text.encode("utf-8"), "text/html; charset=utf-8") == (text, "http")
    # Real GBK bytes are not valid UTF-8: the label still decides.
    assert decode_html_bytes(text.encode("gbk"), None) == (text, "meta")
    assert decode_html_bytes(text.encode("gbk"), "gbk") == (text, "http")


def test_web_pages_warc_yields_110_documents(labse_data):
    path = require_file(labse_data, WEB_PAGES)
    results, stats = read_all(path)
    docs, dropped, errors = split(results)
    assert len(docs) == 110 and dropped == {"warc_type:warcinfo": 1} and not errors
    assert len({d.doc_id for d in docs}) == 110
    # German pages decode with their umlauts intact.
    assert sum("ä" in d.body or "ü" in d.body or "ö" in d.body for d in docs) > 20


def test_wet_conversion_records_become_text_documents(tmp_path, labse_data):
    text = "Erste Zeile des Textes.\nZweite Zeile mit Umlauten: äöü.\n"
    records = [
        warc_record(b"software: test\r\n", warc_type="warcinfo", content_type="application/warc-fields"),
        warc_record(text.encode(), warc_type="conversion", uri="http://example.de/a", content_type="text/plain"),
        warc_record("Вторая страница.\n".encode(), warc_type="conversion", uri="http://example.ru/b", content_type="text/plain"),
    ]
    path = tmp_path / "sample.warc.wet.gz"
    path.write_bytes(gz_members(records))
    results, _ = read_all(path, "wet")
    docs, dropped, errors = split(results)
    assert dropped == {"warc_type:warcinfo": 1} and not errors
    assert [d.kind for d in docs] == ["text", "text"]
    assert docs[0].body == text and docs[0].url == "http://example.de/a"
    # A WARC read as WET: response records are not conversion records.
    _, dropped, _ = split(read_all(require_file(labse_data, CC_SAMPLE), "wet")[0])
    assert dropped["warc_type:response"] == 16


def test_wet_made_from_the_real_web_pages(tmp_path, labse_data):
    """No real WET sample exists: build WET conversion records from the web-pages sample's text."""
    from pipelines.text.html import html_to_lines

    pages = [d for d in read_all(require_file(labse_data, WEB_PAGES))[0] if isinstance(d, Document)][:20]
    texts = ["\n".join(html_to_lines(d.body)) for d in pages]
    records = [warc_record(b"software: test\r\n", warc_type="warcinfo", content_type="application/warc-fields")]
    records += [
        warc_record(text.encode("utf-8"), warc_type="conversion", uri=d.url, content_type="text/plain",
                    record_id=d.doc_id)
        for d, text in zip(pages, texts)
    ]
    path = tmp_path / "web-pages.warc.wet.gz"
    path.write_bytes(gz_members(records))
    docs, dropped, errors = split(read_all(path, "wet")[0])
    assert not errors and dropped == {"warc_type:warcinfo": 1}
    assert [(d.url, d.doc_id, d.body) for d in docs] == [(p.url, p.doc_id, t) for p, t in zip(pages, texts) if t.strip()]


def test_warc_0_18_and_plain_warc(tmp_path):
    path = tmp_path / "old.warc"
    path.write_bytes(b"".join(warc_record(http_block(page(i)), version="WARC/0.18", uri=f"http://e.com/{i}") for i in range(3)))
    docs, dropped, errors = split(read_all(path)[0])
    assert [d.url for d in docs] == ["http://e.com/0", "http://e.com/1", "http://e.com/2"]
    assert docs[1].offset == len(path.read_bytes()) // 3  # byte offsets in a plain file


# ---------------------------------------------------------------- payload decoding
def test_content_encoding_and_charsets(tmp_path):
    russian = "<html><head><title>Новости</title></head><body><p>Привет, мир!</p></body></html>"
    bodies = [
        # gzip Content-Encoding, charset in the header
        http_block(gzip.compress(russian.encode("utf-8")), extra="Content-Encoding: gzip\r\n"),
        # raw deflate, charset only in <meta>
        http_block(
            (lambda c: c.compress(russian.replace("<head>", '<head><meta charset="windows-1251">').encode("cp1251")) + c.flush())(
                zlib.compressobj(wbits=-15)
            ),
            content_type="text/html",
            extra="Content-Encoding: deflate\r\n",
        ),
        # wrong charset declared (utf-8, bytes are cp1251): falls back to detection
        http_block(("<html><body><p>" + "Съешь же ещё этих мягких французских булок. " * 20 + "</p></body></html>").encode("cp1251")),
        # no charset anywhere: detection
        http_block(("<html><body><p>" + "Съешь же ещё этих мягких французских булок. " * 20 + "</p></body></html>").encode("koi8-r"), content_type="text/html"),
        # binary payload labelled text/html
        http_block(bytes(range(256)) * 8),
        # not HTML at all
        http_block(b"%PDF-1.4 ...", content_type="application/pdf"),
        # a redirect
        http_block(b"<html>moved</html>", status="301 Moved Permanently"),
        # chunked Transfer-Encoding over gzip Content-Encoding
        (lambda z: http_block(b"%x\r\n" % 7 + z[:7] + b"\r\n" + b"%x;ext=1\r\n" % (len(z) - 7) + z[7:] + b"\r\n0\r\n\r\n",
                              extra="Transfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n"))(gzip.compress(russian.encode())),
        # brotli Content-Encoding
        http_block(__import__("brotli").compress(russian.encode()), extra="Content-Encoding: br\r\n"),
        # gzip declared but the body is garbage
        http_block(b"\x1f\x8b\x08\x00garbage" + bytes(range(200)), extra="Content-Encoding: gzip\r\n"),
    ]
    path = tmp_path / "payloads.warc.gz"
    path.write_bytes(gz_members([warc_record(b, uri=f"http://e.ru/{i}") for i, b in enumerate(bodies)]))
    results, stats = read_all(path)
    assert len(results) == len(bodies)
    kinds = [r.reason if not isinstance(r, Document) else "doc" for r in results]
    assert kinds == ["doc", "doc", "doc", "doc", "binary_payload", "not_html", "http_status:3xx", "doc", "doc", "bad_content_encoding"]
    assert "Привет, мир!" in results[0].body
    assert "Привет, мир!" in results[1].body
    assert "французских булок" in results[2].body
    assert "французских булок" in results[3].body
    assert "Привет, мир!" in results[7].body and "Привет, мир!" in results[8].body
    assert stats["charset_fallback"] == 1 and stats["charset_detected"] == 1


# ---------------------------------------------------------------- bad input
def test_truncated_gzip_mid_record(tmp_path):
    members = [gzip.compress(r) for r in good_records(5)]
    data = b"".join(members)
    cut = sum(map(len, members[:3])) + len(members[3]) // 2
    path = tmp_path / "truncated.warc.gz"
    path.write_bytes(data[:cut])
    docs, dropped, errors = split(read_all(path)[0])
    assert len(docs) == 3
    assert [(e.reason, e.offset) for e in errors] == [("truncated_gzip", sum(map(len, members[:3])))]


def test_truncated_single_member_file(tmp_path, labse_data):
    # The web-pages sample is one gzip member for all 111 records: cut it in the middle.
    data = require_file(labse_data, WEB_PAGES).read_bytes()
    path = tmp_path / "cut.warc.gz"
    path.write_bytes(data[: len(data) // 2])
    results, _ = read_all(path)
    docs, dropped, errors = split(results)
    assert 30 < len(docs) < 110
    assert [e.reason for e in errors] == ["truncated_gzip"]


def test_garbage_between_gzip_members_is_skipped_and_reading_resumes(tmp_path):
    members = [gzip.compress(r) for r in good_records(4)]
    garbage = b"\x00garbage\xff" * 100 + b"\x1f\x8b\x08 not really gzip"
    path = tmp_path / "garbage.warc.gz"
    path.write_bytes(members[0] + members[1] + garbage + members[2] + members[3])
    docs, dropped, errors = split(read_all(path)[0])
    assert [d.url for d in docs] == [f"http://example.com/{i}" for i in range(4)]
    assert [(e.reason, e.offset) for e in errors] == [("garbage", len(members[0]) + len(members[1]))]


def test_corrupt_member_is_reported_and_the_next_read(tmp_path):
    members = [gzip.compress(r) for r in good_records(3)]
    broken = bytearray(members[1])
    broken[20:40] = b"\xff" * 20
    path = tmp_path / "corrupt.warc.gz"
    path.write_bytes(members[0] + bytes(broken) + members[2])
    docs, dropped, errors = split(read_all(path)[0])
    assert [d.url for d in docs] == ["http://example.com/0", "http://example.com/2"]
    assert [(e.reason, e.offset) for e in errors] == [("corrupt_gzip", len(members[0]))]


def test_garbage_in_plain_warc_is_skipped_to_the_next_record(tmp_path):
    records = good_records(5)
    garbage = b"\x00garbage\xff" * 50 + b"\nWARC/ but not a header"
    path = tmp_path / "garbage.warc"
    path.write_bytes(records[0] + records[1] + garbage + records[2] + records[3] + b"WARC/1.0\r\nbroken header\r\n\r\n" + records[4])
    docs, dropped, errors = split(read_all(path)[0])
    assert [d.url for d in docs] == [f"http://example.com/{i}" for i in range(5)]
    assert [d.offset for d in docs][2] == len(records[0] + records[1] + garbage)
    bad_header_at = len(records[0] + records[1] + garbage + records[2] + records[3])
    assert [(e.reason, e.offset) for e in errors] == [
        ("malformed_warc", len(records[0]) + len(records[1])),
        ("malformed_warc", bad_header_at),
    ]


def test_damage_inside_a_whole_file_gzip_member_is_skipped(tmp_path):
    records = good_records(4)
    plain = records[0] + records[1] + b"\x00garbage\xff" * 50 + records[2] + b"WARC/1.0\r\nbroken header\r\n\r\n" + records[3]
    path = tmp_path / "one-member.warc.gz"
    path.write_bytes(gzip.compress(plain))
    docs, dropped, errors = split(read_all(path)[0])
    assert [d.url for d in docs] == [f"http://example.com/{i}" for i in range(4)]
    assert [(e.reason, e.offset) for e in errors] == [("malformed_warc", 0), ("malformed_warc", 0)]
    assert f"at byte {len(records[0]) + len(records[1])} of the gzip member" in errors[0].detail


def test_garbage_at_the_start_and_end_of_a_plain_warc(tmp_path):
    records = good_records(2)
    path = tmp_path / "garbage.warc"
    path.write_bytes(b"junk junk\n" + records[0] + records[1] + b"trailing junk")
    docs, dropped, errors = split(read_all(path)[0])
    assert len(docs) == 2
    assert [(e.reason, e.offset) for e in errors] == [("malformed_warc", 0), ("malformed_warc", len(b"junk junk\n" + records[0] + records[1]))]


@pytest.mark.parametrize("suffix", [".warc", ".warc.gz"])
def test_malformed_content_length_plain_and_gzip(tmp_path, suffix):
    records = good_records(3)
    bad = warc_record(http_block(page(9)), content_length="12x")
    path = tmp_path / ("badlen" + suffix)
    path.write_bytes(b"".join([records[0], bad, records[2]]) if suffix == ".warc" else gz_members([records[0], bad, records[2]]))
    docs, dropped, errors = split(read_all(path)[0])
    assert [d.url for d in docs] == ["http://example.com/0", "http://example.com/2"]
    assert [e.reason for e in errors] == ["malformed_warc"]


@pytest.mark.parametrize("length", ["abc", "-5", ""])
def test_malformed_content_length(tmp_path, length):
    records = good_records(3)
    bad = warc_record(http_block(page(9)), content_length=length)
    path = tmp_path / "badlen.warc.gz"
    path.write_bytes(gz_members([records[0], bad, records[2]]))
    docs, dropped, errors = split(read_all(path)[0])
    assert [d.url for d in docs] == ["http://example.com/0", "http://example.com/2"]
    assert [e.reason for e in errors] == ["malformed_warc"]


def test_content_length_past_the_end_of_the_member(tmp_path):
    records = good_records(3)
    bad = warc_record(http_block(page(9)), content_length="100000")
    path = tmp_path / "toolong.warc.gz"
    path.write_bytes(gz_members([records[0], bad, records[2]]))
    docs, dropped, errors = split(read_all(path)[0])
    assert len(docs) == 2 and [e.reason for e in errors] == ["malformed_warc"]


def test_plain_warc_cut_inside_a_record(tmp_path):
    records = good_records(3)
    data = b"".join(records)
    path = tmp_path / "cut.warc"
    path.write_bytes(data[: len(data) - 60])
    docs, dropped, errors = split(read_all(path)[0])
    assert len(docs) == 2 and [(e.reason, e.offset) for e in errors] == [("truncated_record", 2 * len(records[0]))]


def test_malformed_http_header_is_an_error_and_reading_goes_on(tmp_path):
    huge_header = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nX-Junk: " + b"a" * 40000 + b"\r\n\r\n<html></html>"
    path = tmp_path / "http.warc.gz"
    path.write_bytes(gz_members([good_records(1)[0], warc_record(huge_header), good_records(1, 1)[0]]))
    docs, dropped, errors = split(read_all(path)[0])
    assert len(docs) == 2 and [e.reason for e in errors] == ["malformed_http"]


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.warc.gz"
    empty.write_bytes(b"")
    assert [(e.reason, e.offset) for e in read_all(empty)[0]] == [("empty_file", 0)]
    assert [e.reason for e in read_all(tmp_path / "nope.warc.gz")[0]] == ["open_failed"]
    assert [e.reason for e in read_all(tmp_path / "nope.xml.bz2", "wikipedia")[0]] == ["open_failed"]


def test_ten_megabyte_single_line_page(tmp_path):
    line = ("<p>" + "word " * 2_000_000 + "</p>").encode()  # ~10 MB, one line
    body = b"<html><body>" + line + b"</body></html>"
    path = tmp_path / "big.warc.gz"
    path.write_bytes(gz_members([good_records(1)[0], warc_record(http_block(body)), good_records(1, 1)[0]]))
    docs, dropped, errors = split(read_all(path)[0])
    assert len(docs) == 3 and len(docs[1].body) == len(body)
    # Above the configurable limit the record is dropped with a counted reason, not decoded.
    docs, dropped, errors = split(read_all(path, limits=ReaderLimits(max_record_bytes=1 << 20))[0])
    assert len(docs) == 2 and dropped == {"too_large": 1}


def test_check_pattern_matches(tmp_path, labse_data):
    require_file(labse_data, CC_SAMPLE)
    assert len(check_pattern_matches(str(labse_data / "commoncrawl" / "*.warc.gz"))) == 2
    with pytest.raises(FileNotFoundError, match="matches no files"):
        check_pattern_matches(str(tmp_path / "*.warc.gz"))


# ---------------------------------------------------------------- real data: Wikipedia
@pytest.fixture(scope="module")
def enwiki_results(labse_data):
    return read_all(require_file(labse_data, ENWIKI), "wikipedia")[0]


@pytest.fixture(scope="module")
def ltgwiki_results(labse_data):
    return read_all(require_file(labse_data, LTGWIKI), "wikipedia")[0]


WIKI_MARKUP = ["{{", "}}", "[[", "]]", "|", "<ref", "</ref", "'''", "''", "__TOC__", "__NOTOC__", "{|", "&nbsp;", "<br"]


def test_enwiki_pages_are_plain_english_text(enwiki_results):
    docs, dropped, errors = split(enwiki_results)
    assert len(enwiki_results) == 206 and not errors  # the sample's 206 pages, one result each
    assert dropped == {"redirect": 100} and len(docs) == 106
    assert all(d.lang == "en" and d.kind == "text" and d.source == "wiki" for d in docs)
    for doc in docs:
        for marker in WIKI_MARKUP:
            assert marker not in doc.body, (doc.url, marker)
    anarchism = next(d for d in docs if d.url == "https://en.wikipedia.org/wiki/Anarchism")
    assert anarchism.doc_id == "wiki:en:12"
    lines = anarchism.body.split("\n")
    assert lines[0].startswith("Anarchism is a political philosophy that advocates self-governed societies")
    assert "Etymology and terminology" in lines  # headings are kept as their own lines
    assert not any(line.startswith(("Category:", "File:", "thumb")) for d in docs for line in d.body.split("\n"))


def test_ltgwiki_pages_are_labelled_ltg_and_redirects_dropped(ltgwiki_results):
    docs, dropped, errors = split(ltgwiki_results)
    assert len(ltgwiki_results) == 2004 and not errors
    # 195 pages carry <redirect> (147 in the article namespace); 954 pages are in other namespaces.
    assert dropped["redirect"] == 195 and dropped["namespace"] == 954 - (195 - 147)
    assert len(docs) + dropped["empty_text"] == 1050 - 147
    assert {d.lang for d in docs} == {"ltg"}
    assert all(d.doc_id.startswith("wiki:ltg:") and d.url.startswith("https://ltg.wikipedia.org/wiki/") for d in docs)
    for doc in docs:
        for marker in WIKI_MARKUP:
            assert marker not in doc.body, (doc.url, marker)
    # Localised namespaces (Fails:, Kategoreja:) are removed like File: and Category:.
    assert not any("Kategoreja:" in d.body or "Fails:" in d.body for d in docs)


def test_all_redirects_in_ltgwiki_are_dropped_as_redirects(ltgwiki_results, labse_data):
    text = bz2.decompress(require_file(labse_data, LTGWIKI).read_bytes()).decode("utf-8")
    assert text.count("<redirect") == 195
    assert sum(1 for r in ltgwiki_results if isinstance(r, Dropped) and r.reason == "redirect") == 195


# ---------------------------------------------------------------- bad Wikipedia input
SITEINFO = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">
  <siteinfo><sitename>Wikipedia</sitename><dbname>zh_yuewiki</dbname>
    <base>https://zh-yue.wikipedia.org/wiki/%E9%A0%AD%E7%89%88</base>
    <namespaces><namespace key="0" /><namespace key="6">文件</namespace><namespace key="14">分類</namespace></namespaces>
  </siteinfo>
"""


def wiki_page(page_id: int, title: str, text: str, ns: int = 0, redirect: bool = False) -> str:
    return (
        f"<page><title>{title}</title><ns>{ns}</ns><id>{page_id}</id>"
        + ('<redirect title="X" />' if redirect else "")
        + f'<revision><id>1</id><text xml:space="preserve">{text}</text></revision></page>\n'
    )


def wiki_dump(*pages: str, close: bool = True) -> bytes:
    return (SITEINFO + "".join(pages) + ("</mediawiki>\n" if close else "")).encode("utf-8")


def test_wikipedia_edition_language_url_and_drops(tmp_path):
    path = tmp_path / "zh_yuewiki.xml"
    path.write_bytes(
        wiki_dump(
            wiki_page(1, "香港", "'''香港'''係一個城市。[[文件:HK.jpg|thumb|圖]][[分類:城市]]"),
            wiki_page(2, "Talk page", "talk", ns=1),
            wiki_page(3, "舊名", "#REDIRECT [[香港]]", redirect=True),
            wiki_page(4, "Empty", "{{stub}}"),
        )
    )
    results, _ = read_all(path, "wikipedia")
    assert [r.reason if not isinstance(r, Document) else "doc" for r in results] == ["doc", "namespace", "redirect", "empty_text"]
    doc = results[0]
    assert (doc.lang, doc.body, doc.doc_id, doc.offset) == ("yue", "香港係一個城市。", "wiki:yue:1", 0)
    assert doc.url == "https://zh-yue.wikipedia.org/wiki/%E9%A6%99%E6%B8%AF"


def test_malformed_xml_keeps_pages_before_it(tmp_path):
    broken = wiki_page(3, "Broken", "text").replace("</title>", "</titel>")
    path = tmp_path / "broken.xml.bz2"
    path.write_bytes(bz2.compress(wiki_dump(wiki_page(1, "A", "First page."), wiki_page(2, "B", "Second page."), broken, wiki_page(4, "D", "never read"))))
    docs, dropped, errors = split(read_all(path, "wikipedia")[0])
    assert [d.body for d in docs] == ["First page.", "Second page."]
    assert [(e.reason, e.offset) for e in errors] == [("malformed_xml", 2)]
    assert "line" in errors[0].detail and "column" in errors[0].detail


def test_truncated_bz2_and_unclosed_dump(tmp_path):
    # 100 kB bz2 blocks, ~300 kB of XML: cutting the file leaves complete blocks before the cut.
    data = bz2.compress(wiki_dump(*(wiki_page(i, f"P{i}", f"Page number {i}. " * 200) for i in range(100))), 1)
    path = tmp_path / "cut.xml.bz2"
    path.write_bytes(data[: len(data) * 2 // 3])
    docs, dropped, errors = split(read_all(path, "wikipedia")[0])
    assert 0 < len(docs) < 100 and [e.reason for e in errors] == ["truncated_bz2"]
    # Well-formed pages but the closing </mediawiki> missing (a dump cut at a page boundary).
    path = tmp_path / "unclosed.xml"
    path.write_bytes(wiki_dump(wiki_page(1, "A", "Only page."), close=False))
    docs, dropped, errors = split(read_all(path, "wikipedia")[0])
    assert len(docs) == 1 and [e.reason for e in errors] == ["malformed_xml"]


def test_empty_and_garbage_wikipedia_files(tmp_path):
    empty = tmp_path / "empty.xml.bz2"
    empty.write_bytes(b"")
    assert [e.reason for e in read_all(empty, "wikipedia")[0]] == ["empty_file"]
    garbage = tmp_path / "garbage.xml.bz2"
    garbage.write_bytes(b"BZh9" + bytes(range(256)) * 4)
    assert [e.reason for e in read_all(garbage, "wikipedia")[0]] == ["corrupt_bz2"]
    binary = tmp_path / "binary.xml"
    binary.write_bytes(bytes(range(256)) * 4)
    assert [e.reason for e in read_all(binary, "wikipedia")[0]] == ["malformed_xml"]


# ---------------------------------------------------------------- accounting identity
@pytest.mark.parametrize("relative,fmt,records", [(CC_SAMPLE, "warc", 50), (WEB_PAGES, "warc", 111)])
def test_identity_on_warc_samples(labse_data, relative, fmt, records):
    results, _ = read_all(require_file(labse_data, relative), fmt)
    docs, dropped, errors = split(results)
    assert len(docs) + sum(dropped.values()) + len(errors) == records


def test_identity_on_wikipedia_samples(enwiki_results, ltgwiki_results, labse_data):
    for results, relative in ((enwiki_results, ENWIKI), (ltgwiki_results, LTGWIKI)):
        pages = bz2.decompress(require_file(labse_data, relative).read_bytes()).count(b"<page>")
        docs, dropped, errors = split(results)
        assert len(docs) + sum(dropped.values()) + len(errors) == pages


# ---------------------------------------------------------------- Beam
def test_read_documents_transform_on_real_file(labse_data, tmp_path):
    import apache_beam as beam
    from apache_beam.internal import pickler
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from pipelines.read.readers import ReadDocuments

    path = require_file(labse_data, CC_SAMPLE)
    empty = tmp_path / "empty.warc.gz"
    empty.write_bytes(b"")
    pattern = str(tmp_path / "*.warc.gz")
    (tmp_path / "cc.warc.gz").symlink_to(path)
    transform = ReadDocuments(pattern, "warc", namespace="clean")
    pickler.loads(pickler.dumps(transform))  # what a Dataflow or multi-process run needs

    def outcome(result):
        if isinstance(result, Document):
            return "doc"
        return ("dropped:" if isinstance(result, Dropped) else "error:") + result.reason

    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as pipeline:
        counts = pipeline | transform | beam.Map(outcome) | beam.combiners.Count.PerElement()
        assert_that(
            counts,
            equal_to([
                ("doc", 16), ("dropped:warc_type:request", 17), ("dropped:warc_type:metadata", 16),
                ("dropped:warc_type:warcinfo", 1), ("error:empty_file", 1),
            ]),
        )
    result = pipeline.result
    from apache_beam.metrics.metric import MetricsFilter

    counters = {c.key.metric.name: c.committed for c in result.metrics().query(MetricsFilter())["counters"]}
    assert counters["documents"] == 16 and counters["errors:empty_file"] == 1 and counters["files"] == 2


def test_read_documents_rejects_unknown_format():
    from pipelines.read.readers import ReadDocuments

    with pytest.raises(ValueError, match="unknown format"):
        ReadDocuments("*.warc.gz", "pdf", namespace="clean")
