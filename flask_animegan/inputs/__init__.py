"""Untrusted bytes to pixels: stills (:mod:`.decoding`), animations and videos (:mod:`.media`),
read in a helper process (:mod:`.helper`) by the :class:`~.isolation.Decoder`."""
