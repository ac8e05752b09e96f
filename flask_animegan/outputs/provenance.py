"""C2PA manifests on results (docs/labels.md), signed with the site's certificate and key:
a ``c2pa.created`` action with the label's digital source type and the style as its software
agent, the upload an ingredient known only by its SHA-256. c2pa-python is imported
only when a certificate is configured (the ``c2pa`` extra)."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import SettingError
from .labels import ContentLabel

__all__ = ["C2paSigner"]

CERT, KEY = "ANIMEGAN_C2PA_CERT", "ANIMEGAN_C2PA_KEY"
#: Our MIME types that c2pa knows by another name (an APNG is a PNG to it).
C2PA_TYPES = {"image/apng": "image/png"}
INSTALL = "pip install 'flask-animegan[c2pa]'"


def _read(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise SettingError(key, f"{key}={path!r} cannot be read ({exc.strerror or exc}): give "
                                "the path of a PEM file the app's user may read") from None


def _signing(key: Any) -> tuple[str, Callable[[bytes], bytes]]:
    """The COSE algorithm of ``key`` and a function that signs with it as C2PA wants."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import (
        ec,
        ed25519,
        padding,
        rsa,
        utils,
    )

    if isinstance(key, ec.EllipticCurvePrivateKey):
        curves = {"secp256r1": ("ES256", hashes.SHA256()), "secp384r1": ("ES384", hashes.SHA384()),
                  "secp521r1": ("ES512", hashes.SHA512())}
        if key.curve.name in curves:
            alg, digest = curves[key.curve.name]
            size = (key.curve.key_size + 7) // 8

            def sign_ec(data: bytes) -> bytes:  # COSE wants r and s, not DER
                r, s = utils.decode_dss_signature(key.sign(data, ec.ECDSA(digest)))
                return r.to_bytes(size, "big") + s.to_bytes(size, "big")

            return alg, sign_ec
    if isinstance(key, rsa.RSAPrivateKey):
        def sign_rsa(data: bytes) -> bytes:
            return key.sign(data, padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())

        return "PS256", sign_rsa
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "ED25519", key.sign
    raise SettingError(KEY, f"{KEY} holds a key C2PA cannot sign with ({type(key).__name__}): "
                            "give an EC key on P-256, P-384 or P-521, an RSA or an Ed25519 key")


@dataclass(frozen=True)
class C2paSigner:
    """The site's C2PA certificate chain (PEM, its own certificate first) and key."""

    chain: str
    alg: str
    sign_bytes: Callable[[bytes], bytes] = field(repr=False)

    @classmethod
    def from_files(cls, cert_path: str, key_path: str) -> C2paSigner:
        """Load and check both files and sign a test picture with them; a problem raises
        :class:`SettingError` naming the setting and the fix."""
        try:
            import c2pa  # noqa: F401 - checked now, used at each signing
        except ImportError:
            raise SettingError(CERT, f"{CERT} needs the c2pa-python package: {INSTALL}, or "
                                     f"unset {CERT} and {KEY}") from None
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        chain = _read(CERT, cert_path)
        try:
            certificates = x509.load_pem_x509_certificates(chain)
        except ValueError:
            raise SettingError(CERT, f"{CERT}={cert_path!r} holds no PEM certificate: give the "
                                     "signing certificate, then its issuers, in PEM") from None
        try:
            key = serialization.load_pem_private_key(_read(KEY, key_path), password=None)
        except TypeError:
            raise SettingError(KEY, f"{KEY}={key_path!r} is encrypted: give the key unencrypted "
                                    "(PKCS#8 PEM), in a file only the app's user may read"
                               ) from None
        except ValueError:
            raise SettingError(KEY, f"{KEY}={key_path!r} holds no PEM private key: give the key "
                                    f"of the first certificate in {CERT}") from None
        public = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        if (certificates[0].public_key().public_bytes(*public)
                != key.public_key().public_bytes(*public)):
            raise SettingError(KEY, f"{KEY}={key_path!r} is not the key of the first "
                                    f"certificate in {CERT}: give that certificate's key, or "
                                    "put the key's certificate first")
        alg, sign_bytes = _signing(key)
        signer = cls(chain.decode("ascii", "replace"), alg, sign_bytes)
        signer._try()
        return signer

    def _try(self) -> None:
        """Sign a small JPEG, so that a chain c2pa refuses stops the app, not a conversion."""
        from PIL import Image

        from .labels import TRAINED

        buffer = io.BytesIO()
        Image.new("RGB", (16, 16)).save(buffer, "JPEG")
        try:
            self.sign(buffer.getvalue(), "image/jpeg",
                      ContentLabel(TRAINED, "test", "test", "test"), b"test")
        except Exception as exc:  # noqa: BLE001 - c2pa's errors have no common base to name
            raise SettingError(CERT, f"c2pa cannot sign with {CERT} and {KEY} ({exc}): the "
                                     "certificate needs the digitalSignature key usage and an "
                                     "extended key usage C2PA accepts (emailProtection or "
                                     "documentSigning), and its issuers after it "
                                     "(docs/labels.md)") from None

    def sign(self, data: bytes, mimetype: str, label: ContentLabel, upload: bytes) -> bytes:
        """``data`` (a result of ``mimetype``) with a manifest embedded; ``upload`` enters it
        only as its SHA-256 (no thumbnail, none of its metadata)."""
        import c2pa

        mimetype = C2PA_TYPES.get(mimetype, mimetype)
        software, _, version = label.software.partition(" ")
        manifest = {
            "claim_generator_info": [{"name": software, "version": version}],
            "title": f"anime-{label.style}",
            "format": mimetype,
            "ingredients": [{
                "title": "the uploaded photo", "format": "application/octet-stream",
                "relationship": "inputTo",
                "instance_id": "sha256:" + hashlib.sha256(upload).hexdigest()}],
            "assertions": [{"label": "c2pa.actions.v2", "data": {"actions": [{
                "action": "c2pa.created",
                "digitalSourceType": label.source_type,
                "softwareAgent": {"name": f"AnimeGANv2 style {label.style}",
                                  "version": label.software},
                "description": f"the style's licence: {label.licence}"}]}}],
        }
        context = c2pa.Context.from_dict({"builder": {"thumbnail": {"enabled": False}}})
        signer = c2pa.Signer.from_callback(self.sign_bytes, getattr(c2pa.C2paSigningAlg, self.alg),
                                           self.chain)
        out = io.BytesIO()
        with c2pa.Builder(manifest, context=context) as builder:
            builder.sign(signer, mimetype, io.BytesIO(data), out)
        signer.close()
        context.close()
        return out.getvalue()
