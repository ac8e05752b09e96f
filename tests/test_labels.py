"""Every result says what made it (docs/labels.md): stills through /convert, a GIF and an
MP4 through the job API, read back by Pillow, PyAV and exiftool; the upload's EXIF, GPS and
XMP never reach a result; C2PA manifests signed with a certificate chain the test makes,
read back by c2pa's own Reader; the settings checked at start."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import av
import pytest
from conftest import build_app, convert, need, open_image, photo
from media import gif_from_photos, video_clip
from PIL import Image
from test_jobs_api import post_job, wait_for

from flask_animegan import __version__
from flask_animegan.outputs.labels import COMPOSITE, TRAINED

SIZE = 64
SECRET = "SecretCam-Model-7"  # the upload's camera, in its EXIF, XMP and comment
IPTC_EXT = "{http://iptc.org/std/Iptc4xmpExt/2008-02-29/}"
OURS = "{https://pypi.org/project/flask-animegan/ns/labels/1.0/}"
EXIFTOOL = shutil.which("exiftool")


def gps_photo() -> bytes:
    """A JPEG as a phone writes it: camera and GPS in EXIF, the camera in XMP and a comment."""
    exif = Image.Exif()
    exif[0x010F], exif[0x0110] = "SecretCam", SECRET  # Make, Model
    gps = exif.get_ifd(0x8825)
    gps.update({1: "N", 2: (48.0, 51.0, 29.5), 3: "E", 4: (2.0, 17.0, 40.2)})
    xmp = (f'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/'
           f'02/22-rdf-syntax-ns#"><rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/" '
           f'tiff:Model="{SECRET}"/></rdf:RDF></x:xmpmeta>').encode()
    buffer = io.BytesIO()
    photo().resize((160, 120)).save(buffer, "JPEG", exif=exif.tobytes(), xmp=xmp,
                                    comment=SECRET.encode())
    return buffer.getvalue()


def xmp_fields(xmp: bytes | str) -> dict[str, str]:
    """The attributes and the x-default texts of an XMP packet's descriptions."""
    text = xmp.decode() if isinstance(xmp, bytes) else xmp
    root = ET.fromstring(text[text.index("<x:xmpmeta"):text.index("</x:xmpmeta>") + 12])
    fields: dict[str, str] = {}
    for description in root.iter("{http://www.w3.org/1999/02/22-rdf-syntax-ns#}Description"):
        fields.update(description.attrib)
        for child in description:
            texts = [li.text or "" for li in child.iter(
                "{http://www.w3.org/1999/02/22-rdf-syntax-ns#}li")]
            if texts:
                fields[child.tag] = texts[0]
    return fields


def exiftool(data: bytes, tmp_path: Path, suffix: str) -> dict[str, object]:
    """What exiftool reads in ``data``, by group and tag (``XMP-iptcExt:DigitalSourceType``)."""
    need(EXIFTOOL is not None, "exiftool is not installed (Debian: libimage-exiftool-perl)")
    path = tmp_path / f"result.{suffix}"
    path.write_bytes(data)
    out = subprocess.run([str(EXIFTOOL), "-j", "-G1", "-a", "-n", str(path)],
                         capture_output=True, text=True, check=True, timeout=60)
    found: dict[str, object] = json.loads(out.stdout)[0]
    return found


def assert_labelled(fields: dict[str, str], style: str, source_type: str = TRAINED) -> None:
    assert fields[IPTC_EXT + "DigitalSourceType"] == source_type
    assert fields[OURS + "Style"] == style
    assert fields[OURS + "StyleLicence"]  # the catalogue's text for the test styles
    assert fields["{http://ns.adobe.com/xap/1.0/}CreatorTool"] == f"flask-animegan {__version__}"


def assert_exiftool_labelled(found: dict[str, object], style: str) -> None:
    assert found["XMP-iptcExt:DigitalSourceType"] == TRAINED
    assert found["XMP-animegan:Style"] == style
    assert found["XMP-animegan:StyleLicence"]
    assert not [tag for tag in found if tag.startswith(("GPS", "Composite:GPS"))
                or ":GPS" in tag], found
    assert SECRET not in json.dumps(found) and "SecretCam" not in json.dumps(found)


# -- stills through /convert --------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["jpeg", "png", "webp"])
def test_a_still_says_what_made_it_and_nothing_of_the_upload(client, fmt, tmp_path):
    upload = gps_photo()
    assert SECRET.encode() in upload and open_image(upload).getexif().get_ifd(0x8825)
    response = convert(client, upload, f"?size={SIZE}&format={fmt}")
    assert response.status_code == 200, response.get_json()
    style = response.headers["X-AnimeGAN-Style"]
    result = open_image(response.data)
    assert_labelled(xmp_fields(result.info["xmp"]), style)
    # none of the upload's metadata: no EXIF at all, no camera anywhere in the bytes
    assert not result.getexif() and SECRET.encode() not in response.data
    assert b"SecretCam" not in response.data and "comment" not in result.info
    found = exiftool(response.data, tmp_path, fmt)
    assert_exiftool_labelled(found, style)
    assert "IFD0:Make" not in found and "IFD0:Model" not in found


def test_the_photo_s_own_colours_make_a_composite(client):
    response = convert(client, gps_photo(), f"?size={SIZE}&colors=keep")
    fields = xmp_fields(open_image(response.data).info["xmp"])
    assert fields[IPTC_EXT + "DigitalSourceType"] == COMPOSITE
    plain = convert(client, gps_photo(), f"?size={SIZE}&colors=luma")
    assert xmp_fields(open_image(plain.data).info["xmp"])[IPTC_EXT + "DigitalSourceType"] == (
        TRAINED)


def test_labels_off_leave_results_bare_and_still_clean(make_app, caplog):
    app = make_app(ANIMEGAN_CONTENT_LABELS=False)
    assert "ANIMEGAN_CONTENT_LABELS is off" in caplog.text
    response = convert(app.test_client(), gps_photo(), f"?size={SIZE}")
    assert response.status_code == 200
    result = open_image(response.data)
    assert "xmp" not in result.info and not result.getexif()
    assert SECRET.encode() not in response.data


# -- animations and videos through the job API ---------------------------------------------
def converted_job(client, body: bytes) -> tuple[bytes, bytes, str]:
    """The result, the preview and the style of a job for ``body``."""
    response = post_job(client, body, size=str(SIZE))
    assert response.status_code == 202, response.get_json()
    done = wait_for(client, response.headers["Location"])[-1]
    assert done["state"] == "done", done
    return (client.get(done["result_url"]).data, client.get(done["preview_url"]).data,
            done["style"])


def test_a_gif_says_what_made_it(client, tmp_path):
    source = Image.open(io.BytesIO(gif_from_photos(6)))
    buffer = io.BytesIO()  # the upload's own comment must not come through
    source.save(buffer, "GIF", save_all=True, comment=SECRET.encode())
    result, preview, style = converted_job(client, buffer.getvalue())
    image = Image.open(io.BytesIO(result))
    assert f"AnimeGANv2 style {style}" in image.info["comment"].decode()
    assert image.n_frames == 6  # the extensions do not break the frames
    # Pillow does not read a GIF's XMP: the raw packet, after its application identifier
    packet = result[result.index(b"XMP DataXMP") + 11:]
    assert_labelled(xmp_fields(packet[:packet.index(b"<?xpacket end")]), style)
    assert SECRET.encode() not in result
    assert_labelled(xmp_fields(open_image(preview).info["xmp"]), style)
    found = exiftool(result, tmp_path, "gif")
    assert_exiftool_labelled(found, style)
    assert found["GIF:FrameCount"] == 6


def test_an_mp4_says_what_made_it_and_drops_the_upload_s_location(client, tmp_path):
    # the upload: a clip whose container and audio stream carry a place and a camera
    plain = av.open(io.BytesIO(video_clip(0.6, fps=10, audio=True)))
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as out:
        out.metadata.update({"location": "+48.8584+002.2945/", "make": "SecretCam",
                             "model": SECRET, "comment": SECRET})
        streams = {s.index: out.add_stream_from_template(s) for s in plain.streams}
        streams[1].metadata["handler_name"] = SECRET
        for packet in plain.demux():
            if packet.dts is not None:
                packet.stream = streams[packet.stream.index]
                out.mux(packet)
    plain.close()
    assert SECRET.encode() in buffer.getvalue()
    result, _, style = converted_job(client, buffer.getvalue())
    assert SECRET.encode() not in result and b"SecretCam" not in result
    with av.open(io.BytesIO(result)) as video:
        tags = video.metadata
        assert f"AnimeGANv2 style {style}" in tags["comment"] and "location" not in tags
        assert TRAINED.rsplit("/", 1)[1] in tags["description"]
        frames = sum(1 for _ in video.decode(video=0))
        assert frames == 6 and video.streams.audio  # the box after the index breaks nothing
    found = exiftool(result, tmp_path, "mp4")
    assert_exiftool_labelled(found, style)
    assert not [tag for tag in found if "GPS" in tag or tag.endswith(":Make")]


# -- C2PA ------------------------------------------------------------------------------------
def certificate_chain(folder: Path, *, eku: bool = True) -> tuple[Path, Path, Path]:
    """A test CA and an ES256 signing certificate it issued, with the key usages C2PA asks
    for: the chain file (signer first), the key file and the CA file."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common),
                          x509.NameAttribute(NameOID.ORGANIZATION_NAME, "flask-animegan tests")])

    def usage(**on: bool) -> x509.KeyUsage:
        flags = dict.fromkeys(("digital_signature", "content_commitment", "key_encipherment",
                               "data_encipherment", "key_agreement", "key_cert_sign",
                               "crl_sign", "encipher_only", "decipher_only"), False)
        return x509.KeyUsage(**{**flags, **on})

    now = dt.datetime.now(dt.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("Test CA")).issuer_name(name("Test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=7))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(usage(key_cert_sign=True, crl_sign=True), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    signer = (x509.CertificateBuilder().subject_name(name("Test signer")).issuer_name(ca.subject)
              .public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - dt.timedelta(days=1))
              .not_valid_after(now + dt.timedelta(days=7))
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(usage(digital_signature=True), critical=True)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                  ca_key.public_key()), critical=False))
    if eku:
        signer = signer.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]), critical=False)
    pem = serialization.Encoding.PEM
    chain, key_file, ca_file = folder / "chain.pem", folder / "key.pem", folder / "ca.pem"
    chain.write_bytes(signer.sign(ca_key, hashes.SHA256()).public_bytes(pem)
                      + ca.public_bytes(pem))
    key_file.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    ca_file.write_bytes(ca.public_bytes(pem))
    return chain, key_file, ca_file


@pytest.fixture(scope="module")
def signing(tmp_path_factory, models_dir, openvino_cache):
    """An app that signs its stills with a test chain, and the test CA."""
    pytest.importorskip("c2pa", reason="pip install 'flask-animegan[c2pa]'")
    chain, key, ca = certificate_chain(tmp_path_factory.mktemp("c2pa"))
    app = build_app(models_dir, openvino_cache, ANIMEGAN_C2PA_CERT=str(chain),
                    ANIMEGAN_C2PA_KEY=str(key))
    return app, ca.read_text()


def read_manifest(data: bytes, mimetype: str, anchors: str | None = None):
    import c2pa

    context = c2pa.Context.from_dict({"trust": {"trust_anchors": anchors}}) if anchors else None
    reader = (c2pa.Reader(mimetype, io.BytesIO(data), context=context) if context
              else c2pa.Reader(mimetype, io.BytesIO(data)))
    return reader.get_active_manifest(), reader.get_validation_state(), \
        reader.get_validation_results()


@pytest.mark.parametrize("fmt", ["jpeg", "png", "webp"])
def test_a_still_carries_a_signed_c2pa_manifest(signing, fmt):
    app, ca = signing
    client = app.test_client()
    upload = gps_photo()
    for attempt in ("converted", "from the cache"):
        response = convert(client, upload, f"?size={SIZE}&format={fmt}")
        assert response.status_code == 200, response.get_json()
        assert response.headers["X-Cache"] == ("MISS" if attempt == "converted" else "HIT")
        style = response.headers["X-AnimeGAN-Style"]
        manifest, state, results = read_manifest(response.data, response.mimetype)
        (action,) = next(a["data"]["actions"] for a in manifest["assertions"]
                         if a["label"].startswith("c2pa.actions"))
        assert action["action"] == "c2pa.created"
        assert action["digitalSourceType"] == TRAINED
        assert action["softwareAgent"]["name"] == f"AnimeGANv2 style {style}"
        (ingredient,) = manifest["ingredients"]
        assert ingredient["relationship"] == "inputTo"
        assert ingredient["instance_id"] == "sha256:" + hashlib.sha256(upload).hexdigest()
        assert "thumbnail" not in ingredient and "thumbnail" not in manifest
        # valid, but signed by a CA no trust list holds: c2pa says so, and only that
        failures = [item["code"] for item in results["activeManifest"].get("failure", [])]
        assert (state, failures) == ("Valid", ["signingCredential.untrusted"]), results
        # with the test CA as a trust anchor, as a certificate from a trusted list would be
        assert read_manifest(response.data, response.mimetype, ca)[1] == "Trusted"
        # the XMP labels are kept beside the manifest, the upload's metadata is not
        result = open_image(response.data)
        assert_labelled(xmp_fields(result.info["xmp"]), style)
        assert SECRET.encode() not in response.data and not result.getexif()


def test_c2pa_settings_are_checked_at_start(make_app, tmp_path):
    pytest.importorskip("c2pa", reason="pip install 'flask-animegan[c2pa]'")
    chain, key, _ = certificate_chain(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    _, other_key, _ = certificate_chain(other)
    no_eku = tmp_path / "no-eku"
    no_eku.mkdir()
    bare_chain, bare_key, _ = certificate_chain(no_eku, eku=False)
    cases = [
        ({"ANIMEGAN_C2PA_CERT": str(chain)}, "ANIMEGAN_C2PA_KEY"),
        ({"ANIMEGAN_C2PA_KEY": str(key)}, "ANIMEGAN_C2PA_CERT"),
        ({"ANIMEGAN_C2PA_CERT": str(tmp_path / "missing.pem"), "ANIMEGAN_C2PA_KEY": str(key)},
         "ANIMEGAN_C2PA_CERT='"),
        ({"ANIMEGAN_C2PA_CERT": str(key), "ANIMEGAN_C2PA_KEY": str(key)}, "holds no PEM cert"),
        ({"ANIMEGAN_C2PA_CERT": str(chain), "ANIMEGAN_C2PA_KEY": str(other_key)},
         "is not the key of the first certificate"),
        ({"ANIMEGAN_C2PA_CERT": str(bare_chain), "ANIMEGAN_C2PA_KEY": str(bare_key)},
         "extended key usage"),
        ({"ANIMEGAN_C2PA_CERT": str(chain), "ANIMEGAN_C2PA_KEY": str(key),
          "ANIMEGAN_CONTENT_LABELS": False}, "ANIMEGAN_CONTENT_LABELS is off"),
    ]
    for config, named in cases:
        with pytest.raises(RuntimeError, match="configuration error") as caught:
            make_app(**config)
        assert named in str(caught.value), (config, caught.value)


@pytest.mark.parametrize("kind", ["gif", "mp4"])
def test_an_animation_and_a_video_carry_a_signed_c2pa_manifest(signing, kind):
    app, ca = signing
    upload = gif_from_photos(4) if kind == "gif" else video_clip(0.4, fps=10, audio=True)
    result, _, style = converted_job(app.test_client(), upload)
    mimetype = "image/gif" if kind == "gif" else "video/mp4"
    manifest, state, results = read_manifest(result, mimetype)
    (action,) = next(a["data"]["actions"] for a in manifest["assertions"]
                     if a["label"].startswith("c2pa.actions"))
    assert (action["action"], action["digitalSourceType"]) == ("c2pa.created", TRAINED)
    assert action["softwareAgent"]["name"] == f"AnimeGANv2 style {style}"
    (ingredient,) = manifest["ingredients"]
    assert ingredient["instance_id"] == "sha256:" + hashlib.sha256(upload).hexdigest()
    failures = [item["code"] for item in results["activeManifest"].get("failure", [])]
    assert (state, failures) == ("Valid", ["signingCredential.untrusted"]), results
    assert read_manifest(result, mimetype, ca)[1] == "Trusted"
    if kind == "gif":  # still a GIF of every frame, its XMP beside the manifest
        assert Image.open(io.BytesIO(result)).n_frames == 4
        packet = result[result.index(b"XMP DataXMP") + 11:]
        assert_labelled(xmp_fields(packet[:packet.index(b"<?xpacket end")]), style)
    else:
        with av.open(io.BytesIO(result)) as video:
            assert sum(1 for _ in video.decode(video=0)) == 4 and video.streams.audio
