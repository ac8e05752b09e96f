"""Long work as jobs: animations and videos converted frame by frame, in the background.

:mod:`.encoders` writes the converted frames back out as the upload's kind (GIF, animated WebP,
APNG, MP4/H.264 with the source's audio) and makes the preview still.
"""
