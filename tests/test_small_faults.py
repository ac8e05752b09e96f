"""Smaller faults, each as a class: redirects that stay on the site, the
``download`` switch, caching headers of pages, and sizes written in ASCII digits only."""

from __future__ import annotations

import io
import sys
import unicodedata

import pytest
from conftest import convert, photo_bytes

#: "64" in every decimal-digit script Python's int() reads (Arabic-Indic, fullwidth, ...).
FOREIGN_64 = sorted({
    chr(zero + 6) + chr(zero + 4)
    for zero in range(sys.maxunicode + 1)
    if unicodedata.category(chr(zero)) == "Nd" and unicodedata.decimal(chr(zero)) == 0
    and zero != ord("0")})


def test_every_non_ascii_spelling_of_64_is_one_int_reads():
    assert len(FOREIGN_64) > 50 and all(int(text) == 64 for text in FOREIGN_64)


@pytest.mark.parametrize("raw", [*FOREIGN_64, "1_6", "6_4", "+64", "-0", "64.0", "6 4",
                                 "0x40", "64\x00", "1e2", "٦4"])
def test_a_size_not_in_ascii_digits_is_refused(app, raw):
    service = app.extensions["animegan"]
    with pytest.raises(Exception, match="size must be a whole number") as caught:
        service.parse({"size": raw})
    assert getattr(caught.value, "status", None) == 400


@pytest.mark.parametrize("raw", ["٦٤", "６４", "1_6"])
def test_the_api_and_form_answer_400_to_such_sizes(client, raw):
    response = convert(client, photo_bytes(), f"?size={raw}")
    assert response.status_code == 400 and "size must be" in response.json["error"]
    page = client.post("/animegan/upload", data={"size": raw, "image": (
        io.BytesIO(photo_bytes()), "p.jpg")})
    assert page.status_code == 400 and "size must be" in page.get_data(as_text=True).lower()


@pytest.mark.parametrize("raw", ["64", " 64 ", "064", "0064"])
def test_ascii_sizes_still_work(app, raw):
    assert app.extensions["animegan"].parse({"size": raw}).size == 64


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "[::1]:1",
                                  "localhost"])
@pytest.mark.parametrize("path,query", [("/animegan", ""), ("/animegan", "?a=1&b=%2F"),
                                        ("/animegan", "?next=//evil.example/")])
def test_slash_redirects_are_paths_never_a_host_the_client_chose(client, host, path, query):
    response = client.get(path + query, headers={"Host": host})
    assert response.status_code == 308
    location = response.headers["Location"]
    assert location == path + "/" + query
    assert location.startswith(path + "/") and not location.startswith("//")
    assert host not in location.split("?")[0]


def test_slash_redirects_with_a_forwarded_host_stay_paths(make_app):
    client = make_app(ANIMEGAN_TRUSTED_PROXIES=1).test_client()
    response = client.get("/animegan", headers={"X-Forwarded-Host": "evil.example",
                                                "X-Forwarded-Proto": "https"})
    assert response.status_code == 308 and response.headers["Location"] == "/animegan/"


def _form_result(client) -> str:
    response = client.post("/animegan/upload", data={
        "image": (io.BytesIO(photo_bytes("astronaut")), "me.jpg"),
        "style": "other_style", "size": "64"})
    assert response.status_code == 303
    return response.headers["Location"]


@pytest.mark.parametrize("value,attachment", [
    ("1", True), ("true", True), ("yes", True), ("on", True), ("TRUE", True),
    ("0", False), ("false", False), ("no", False), ("off", False), ("", False),
    (None, False)])
def test_download_switch_means_what_it_says(client, value, attachment):
    page = _form_result(client)
    query = "" if value is None else f"?download={value}"
    response = client.get(f"{page}/anime{query}")
    assert response.status_code == 200
    assert ("Content-Disposition" in response.headers) is attachment
    if attachment:
        assert response.headers["Content-Disposition"].startswith("attachment; filename=")


@pytest.mark.parametrize("value", ["2", "maybe", "1.0", "yes please", "ｙｅｓ"])
def test_a_download_value_that_means_nothing_is_a_400(client, value):
    page = _form_result(client)
    response = client.get(f"{page}/anime?download={value}")
    assert response.status_code == 400
    assert "download must be 1 or 0" in response.get_data(as_text=True).lower()


def test_pages_say_how_they_may_be_cached(client):
    page = _form_result(client)
    result = client.get(page)
    assert result.status_code == 200
    assert result.headers["Cache-Control"] == "private, no-store"
    assert client.get("/animegan/").headers["Cache-Control"] == "private, no-cache"
    for kind in ("anime", "original"):
        assert client.get(f"{page}/{kind}").headers["Cache-Control"].startswith("private")
    api = convert(client, photo_bytes(), "?size=64")
    assert api.headers["Cache-Control"] == "no-store"
