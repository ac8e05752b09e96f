"""Errors a conversion can end in; each knows its HTTP status and what to tell the user."""

from __future__ import annotations


class ConversionError(Exception):
    """Base class: ``str(error)`` is a message fit to show the person who sent the image."""

    status = 400
    retry_after: int | None = None


class BadImage(ConversionError):
    status = 400


class UnsupportedImage(ConversionError):
    status = 415


class ImageTooLarge(ConversionError):
    status = 413


class BadParameter(ConversionError):
    status = 400


class UnknownStyle(ConversionError):
    status = 404


class StyleUnavailable(ConversionError):
    """No style installed, or the style's weights failed to load."""

    status = 503
    retry_after = 60


class Overloaded(ConversionError):
    status = 503

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StorageUnavailable(Overloaded):
    """The jobs' storage (Redis) cannot be reached: nothing stored was lost, so the client
    is told to try again, never that its job is gone."""

    #: Seconds a client is told to wait.
    RETRY_AFTER = 30

    def __init__(self, message: str = "") -> None:
        super().__init__(message or (
            "the job store cannot be reached just now; the job is kept: try again in "
            f"{self.RETRY_AFTER} s"), self.RETRY_AFTER)
