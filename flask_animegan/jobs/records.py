"""What a job is (:class:`JobRecord`) and where it lives (:class:`JobStore`: keys with a
TTL, a list per client, one of started runs for the sweep; clients as keyed digests)."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..errors import StorageUnavailable
from ..inputs.media import AudioTrack
from ..outputs.segments import Segment, pack, unpack
from ..storage import Storage

#: What a job id looks like (``secrets.token_urlsafe(24)``); anything else is no job.
JOB_ID = re.compile(r"[A-Za-z0-9_-]{32}")
#: The newest jobs kept in a client's list, where its unfinished ones are counted.
CLIENT_LIST_CAP = 32
#: The newest runs the sweep looks through for stalled ones.
STARTED_LIST_CAP = 256
STARTED_INDEX = "jobs:started"


class JobState(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


UNFINISHED = (JobState.QUEUED, JobState.RUNNING)


@dataclass
class JobRecord:
    """One job as the API reports it; times are Unix seconds (clocks in step by NTP)."""

    id: str
    state: JobState
    client: str  # keyed digest of the client's rate-limit key
    style: str
    size: int
    kind: str  # "animation", "video" or "photo" (a still that runs in tiles)
    format: str  # the upload's: GIF, WEBP, PNG, MP4, JPEG, ...
    frames_total: int
    colors: str = "off"
    portrait: str = "off"  # a photo's portrait mode
    output_format: str | None = None  # a photo's: jpeg, png or webp
    tiles_done: int = 0  # a photo's progress
    tiles_total: int = 0
    strength: int = 100  # percent of the style, mixed into each frame
    frames_done: int = 0
    frames_reused: int = 0
    created_at: float = 0.0
    started_at: float | None = None
    updated_at: float = 0.0  # the heartbeat while running
    finished_at: float | None = None
    eta_s: float | None = None
    error: str | None = None  # fit to show the person who sent the upload
    result_mimetype: str | None = None
    attempts: int = 0  # runs started
    #: runs lost (a stalled or dead worker) before they finished a segment: a job is run
    #: again after one such; a run that finished a segment is no fault of the job's
    lost_runs: int = 0
    #: an animation's or video's segments (outputs/segments.py): frames in one, those
    #: finished and kept (a run resumes at the next), their reused frames, and where this
    #: run started
    segment_frames: int = 0
    segments_done: int = 0
    segments_reused: int = 0
    run_from: int = 0
    #: why the frames end before the upload's last (the rate limit ran out), once known
    stopped: str | None = None
    cancel_requested: bool = False
    #: the rate limit's key of the client (its request args), where the frames are charged;
    #: emptied when the job ends
    charge_key: list[str] = field(default_factory=list)
    charged: int = 0  # conversions taken from the client's allowance so far

    @property
    def finished(self) -> bool:
        return self.state not in UNFINISHED

    @property
    def progress(self) -> float:
        """Frames (a photo: tiles) done over those in all, 0 to 1 (1 once done)."""
        if self.state == JobState.DONE:
            return 1.0
        done, total = ((self.tiles_done, self.tiles_total) if self.kind == "photo"
                       else (self.frames_done, self.frames_total))
        return min(done / total, 1.0) if total else 0.0

    def to_bytes(self) -> bytes:
        fields = dataclasses.asdict(self)
        fields["state"] = self.state.value
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> JobRecord | None:
        """The record in ``blob``, or None for something that is no record."""
        try:
            fields: dict[str, Any] = json.loads(blob)
            fields["state"] = JobState(fields["state"])
            return cls(**fields)
        except (ValueError, TypeError, KeyError):
            return None


class JobStore:
    """Jobs' records, uploads and results in a :class:`Storage`, each key with ``ttl``."""

    def __init__(self, storage: Storage, *, ttl: float, secret: bytes = b"") -> None:
        self.storage = storage
        self.ttl = ttl
        self._secret = secret

    def client_digest(self, client: str) -> str:
        """The keyed digest a record keeps of a client, so the storage never lists who sent what."""
        return hmac.new(self._secret, client.encode(), hashlib.sha256).hexdigest()[:32]

    def create(self, data: bytes, *, client: str, style: str, size: int, kind: str,
               format: str, frames_total: int, colors: str = "off",
               strength: int = 100, **photo: Any) -> JobRecord | None:
        """A new queued job holding ``data`` (``photo``: a photo's fields of JobRecord);
        None when the storage refused it (down or full)."""
        now = time.time()
        record = JobRecord(id=secrets.token_urlsafe(24), state=JobState.QUEUED,
                           client=self.client_digest(client), style=style, size=size,
                           kind=kind, format=format, frames_total=frames_total,
                           colors=colors, strength=strength, created_at=now, updated_at=now,
                           **photo)
        if not self.storage.set(self._key(record.id, "input"), data, self.ttl):
            return None
        if not self.storage.set_indexed(self._key(record.id), record.to_bytes(),
                                        index=f"client:{record.client}",
                                        member=record.id.encode(), ttl=self.ttl,
                                        cap=CLIENT_LIST_CAP):
            self.drop_input(record.id)
            return None
        return record

    def get(self, job_id: str) -> JobRecord | None:
        """The record of ``job_id`` as stored (None: no such job, or it expired)."""
        if not JOB_ID.fullmatch(job_id):
            return None
        blob = self.storage.get(self._key(job_id))
        record = JobRecord.from_bytes(blob) if blob else None
        if record is not None and record.id == job_id and not record.finished:
            record.cancel_requested = self.cancel_requested(job_id)
        return record if record is not None and record.id == job_id else None

    def vouch_absent(self) -> None:
        """Call where a read found nothing: :class:`StorageUnavailable` (503) when that is
        because the storage is down, so nobody is told a kept job has gone."""
        if not self.storage.reachable:
            raise StorageUnavailable

    def update(self, record: JobRecord) -> bool:
        """Store ``record`` (its TTL starts again); False when the storage refused it."""
        return self.storage.set(self._key(record.id), record.to_bytes(), self.ttl)

    def start(self, record: JobRecord) -> bool:
        """Store a just-started run and list it for the sweep; False when refused."""
        return self.storage.set_indexed(self._key(record.id), record.to_bytes(),
                                        index=STARTED_INDEX, member=record.id.encode(),
                                        ttl=self.ttl, cap=STARTED_LIST_CAP)

    def claim(self, job_id: str, step: str, ttl: float) -> bool:
        """Whether this caller takes ``step`` (first within ``ttl``); False if unavailable."""
        return self.storage.add(self._key(job_id, f"claim:{step}"), b"1", ttl)

    def client_jobs(self, client: str) -> list[JobRecord]:
        """The records of the client's newest jobs (CLIENT_LIST_CAP at most), as stored."""
        digest = self.client_digest(client)
        return self._records(self.storage.index(f"client:{digest}", CLIENT_LIST_CAP))

    def started(self) -> list[JobRecord]:
        """The newest started runs still running as stored, newest first."""
        return [record for record in
                self._records(self.storage.index(STARTED_INDEX, STARTED_LIST_CAP))
                if record.state == JobState.RUNNING]

    def _records(self, members: list[bytes]) -> list[JobRecord]:
        ids = dict.fromkeys(member.decode(errors="replace") for member in members)
        return [record for job_id in ids if (record := self.get(job_id)) is not None]

    # cancelling: a key of its own, so a worker's progress update never overwrites it
    def request_cancel(self, job_id: str) -> bool:
        return self.storage.set(self._key(job_id, "cancel"), b"1", self.ttl)

    def cancel_requested(self, job_id: str) -> bool:
        return self.storage.get(self._key(job_id, "cancel")) is not None

    def get_input(self, job_id: str) -> bytes | None:
        return self.storage.get(self._key(job_id, "input")) or None

    def drop_input(self, job_id: str) -> None:
        """Forget the upload of an ended job (overwritten, expiring at once)."""
        self.storage.set(self._key(job_id, "input"), b"", 1)  # a TTL of 0 stores nothing

    def put_result(self, job_id: str, data: bytes, preview: bytes | None = None) -> bool:
        """Store the result (and its preview, unless stored already)."""
        return (self.storage.set(self._key(job_id, "result"), data, self.ttl)
                and (preview is None or self.put_preview(job_id, preview)))

    def put_preview(self, job_id: str, preview: bytes) -> bool:
        return self.storage.set(self._key(job_id, "preview"), preview, self.ttl)

    def put_segment(self, job_id: str, segment: Segment) -> bool:
        """Keep a finished segment for the join and the page (False: refused)."""
        return self.storage.set(self._key(job_id, f"segment:{segment.index}"),
                                segment.to_bytes(), self.ttl)

    def get_segments(self, job_id: str, count: int) -> list[Segment] | None:
        """The job's first ``count`` segments; None if one has expired or is unreadable."""
        found = []
        for index in range(count):
            blob = self.storage.get(self._key(job_id, f"segment:{index}"))
            segment = Segment.from_bytes(blob) if blob else None
            if segment is None or segment.index != index:
                return None
            found.append(segment)
        return found

    def put_audio(self, job_id: str, track: AudioTrack | None, error: str | None) -> bool:
        """Keep the video's audio track as read once (or why it is left out), so that every
        run writes the same."""
        head = {"error": error, "track": None if track is None else {
            "codec": track.codec, "transcoded": track.transcoded, "complete": track.complete}}
        blob = pack(head, track.data if track else b"")
        return self.storage.set(self._key(job_id, "audio"), blob, self.ttl)

    def get_audio(self, job_id: str) -> tuple[AudioTrack | None, str | None] | None:
        """The audio kept by :meth:`put_audio` (track, error); None if none is kept."""
        blob = self.storage.get(self._key(job_id, "audio"))
        unpacked = unpack(blob) if blob else None
        if unpacked is None:
            return None
        head, data = unpacked
        try:
            track = head["track"]
            return (None if track is None else AudioTrack(
                data, str(track["codec"]), bool(track["transcoded"]),
                bool(track["complete"])), head["error"])
        except (TypeError, KeyError):
            return None

    def drop_parts(self, job_id: str, segments: int) -> None:
        """Forget an ended job's segments and audio (the result holds them now)."""
        for index in range(segments):
            self.storage.set(self._key(job_id, f"segment:{index}"), b"", 1)
        self.storage.set(self._key(job_id, "audio"), b"", 1)

    def get_result(self, job_id: str) -> bytes | None:
        return self.storage.get(self._key(job_id, "result")) if JOB_ID.fullmatch(job_id) else None

    def get_preview(self, job_id: str) -> bytes | None:
        return self.storage.get(self._key(job_id, "preview")) if JOB_ID.fullmatch(job_id) else None

    @staticmethod
    def _key(job_id: str, part: str = "") -> str:
        return f"job:{job_id}:{part}" if part else f"job:{job_id}"
