"""What a result says about how it was made (docs/labels.md): IPTC's digital source type,
the style and its licence, the software, as an XMP packet, in each container's own place."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol
from xml.sax.saxutils import escape, quoteattr

__all__ = ["COMPOSITE", "TRAINED", "ContentLabel", "Labelling", "Signer", "gif_extensions",
           "jpeg_with_xmp", "mp4_xmp_box"]

_CODES = "http://cv.iptc.org/newscodes/digitalsourcetype/"
#: Every pixel came out of the network (portrait mode too: faces and scene are converted).
TRAINED = _CODES + "trainedAlgorithmicMedia"
#: The network's output mixed with the photo's own pixels (its colours kept, a weaker style).
COMPOSITE = _CODES + "compositeWithTrainedAlgorithmicMedia"

#: XMP's APP1 signature in a JPEG, its ``uuid`` box in an MP4 (ISO BMFF), its GIF extension.
JPEG_XMP = b"http://ns.adobe.com/xap/1.0/\x00"
MP4_XMP_UUID = bytes.fromhex("BE7ACFCB97A942E89C71999491E3AFAC")
GIF_XMP = b"XMP DataXMP"
#: This package's XMP namespace, for the style's name and licence.
NAMESPACE = "https://pypi.org/project/flask-animegan/ns/labels/1.0/"


@dataclass(frozen=True)
class ContentLabel:
    """How one result was made: ``source_type`` (an IPTC URI), the style, its licence, the
    software (name and version)."""

    source_type: str
    style: str
    licence: str
    software: str

    @property
    def sentence(self) -> str:
        """The label in words, for comments and descriptions."""
        kind = ("partly AI-generated" if self.source_type == COMPOSITE else "AI-generated")
        return (f"{kind} ({self.source_type.rsplit('/', 1)[1]}) by {self.software}, "
                f"AnimeGANv2 style {self.style} (licence: {self.licence})")

    def xmp(self) -> bytes:
        """The XMP packet: IPTC's DigitalSourceType and AISystemUsed, the style and its
        licence (ours and xmpRights:UsageTerms), the software (xmp:CreatorTool)."""
        def alt(text: str) -> str:
            return (f'<rdf:Alt><rdf:li xml:lang="x-default">{escape(text)}</rdf:li>'
                    "</rdf:Alt>")

        body = (
            '<rdf:Description rdf:about=""'
            ' xmlns:Iptc4xmpExt="http://iptc.org/std/Iptc4xmpExt/2008-02-29/"'
            ' xmlns:xmp="http://ns.adobe.com/xap/1.0/"'
            ' xmlns:dc="http://purl.org/dc/elements/1.1/"'
            ' xmlns:xmpRights="http://ns.adobe.com/xap/1.0/rights/"'
            f" xmlns:animegan={quoteattr(NAMESPACE)}"
            f" Iptc4xmpExt:DigitalSourceType={quoteattr(self.source_type)}"
            f" Iptc4xmpExt:AISystemUsed={quoteattr('AnimeGANv2 style ' + self.style)}"
            f" xmp:CreatorTool={quoteattr(self.software)}"
            f" animegan:Style={quoteattr(self.style)}"
            f" animegan:StyleLicence={quoteattr(self.licence)}>"
            f"<dc:description>{alt(self.sentence)}</dc:description>"
            "<xmpRights:UsageTerms>"
            f"{alt(f'Made with the style {self.style}, whose licence is: {self.licence}')}"
            "</xmpRights:UsageTerms>"
            "</rdf:Description>")
        return ('<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>'
                '<x:xmpmeta xmlns:x="adobe:ns:meta/">'
                '<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
                f"{body}</rdf:RDF></x:xmpmeta>"
                '<?xpacket end="r"?>').encode()

    def tags(self) -> dict[str, str]:
        """Container metadata for a video (keys FFmpeg's MP4 muxer writes; it sets ``encoder``
        itself)."""
        return {"comment": self.sentence, "description": self.sentence}


def jpeg_with_xmp(jpeg: bytes, xmp: bytes) -> bytes:
    """``jpeg`` with an XMP APP1 segment after its SOI and APP0 (JFIF wants APP0 first)."""
    if jpeg[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG")
    at = 2
    if jpeg[2:4] == b"\xff\xe0":
        at += 2 + struct.unpack(">H", jpeg[4:6])[0]
    payload = JPEG_XMP + xmp
    if len(payload) + 2 > 0xFFFF:
        raise ValueError("the XMP packet is too long for one JPEG segment")
    return jpeg[:at] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + jpeg[at:]


def gif_extensions(label: ContentLabel) -> bytes:
    """A GIF's XMP application extension (XMP's "magic trailer" lets readers that do not
    know it skip it as sub-blocks) and a comment extension with the label in words."""
    xmp = label.xmp()
    trailer = b"\x01" + bytes(range(255, -1, -1)) + b"\x00"
    comment = label.sentence.encode()[:255 * 8]
    blocks = b"".join(bytes([len(comment[at:at + 255])]) + comment[at:at + 255]
                      for at in range(0, len(comment), 255))
    return b"!\xff\x0b" + GIF_XMP + xmp + trailer + b"!\xfe" + blocks + b"\x00"


def mp4_xmp_box(label: ContentLabel) -> bytes:
    """A top-level ``uuid`` box holding the XMP packet, where Adobe's and exiftool's
    readers look for an MP4's XMP; players skip boxes they do not know."""
    xmp = label.xmp()
    return struct.pack(">I", 8 + 16 + len(xmp)) + b"uuid" + MP4_XMP_UUID + xmp


class Signer(Protocol):
    """What signs a result's label into it (provenance.C2paSigner)."""

    def sign(self, data: bytes, mimetype: str, label: ContentLabel, upload: bytes) -> bytes: ...


@dataclass(frozen=True)
class Labelling:
    """What an app writes into its results: the software (name and version) and, with a
    certificate configured, the C2PA signer of its results."""

    software: str
    signer: Signer | None = None
