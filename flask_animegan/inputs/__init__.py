"""Uploads in, results out: decoding an untrusted upload into a :class:`~.decoding.DecodedUpload`
(:mod:`.decoding`), in helper processes behind a gate (:mod:`.isolation`, :mod:`.helper`), and
encoding results (:mod:`.formats`). Pillow and NumPy only: never torch nor Flask."""
