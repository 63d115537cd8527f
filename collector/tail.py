"""``--tail GLOB``: follow the NDJSON files the file sink writes, rotation-safe.

The file sink appends to ``PATH`` and renames it to ``PATH.YYYYMMDDHH.NNNN`` when it rotates
(``hopline.middleware.sinks``), so tail ``'PATH*'``. Files are followed by identity, not name:
the reading position is kept per ``(device, inode)``, so a file renamed while being read is
finished under its new name, and a new file at ``PATH`` is read from its start. Only complete
lines are consumed (a partly written last line waits for its newline). Each poll reads files in
order of modification time (rotated files before the live one). A file that shrank was
truncated and is read again from its start; files that vanished are forgotten.

Positions advance only after the lines were stored, and are saved in ``DIR/tail-state.json``
after every stored chunk, so a restarted collector resumes where it stopped instead of storing
the files again.
"""

from __future__ import annotations

import asyncio
import glob
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
from hopline.collector.config import CollectorConfig
from hopline.collector.ingest import IngestError
from hopline.collector.store import StoreError
from hopline.middleware.log import logger
from hopline.middleware.contract.records import translate_lines

CHUNK_BYTES = 4 * 1024 * 1024  # read at most this much of one file per step
STATE_FILE = "tail-state.json"  # in the data directory: each followed file's read position


class Tailer:
    def __init__(
        self,
        tail: tuple[str, ...],
        state_path: Path,
        ingest: Callable[[bytes], Awaitable[object]],
        *,
        tail_interval: float,
    ) -> None:
        self.patterns = tail
        self.state_path = Path(state_path)
        self.ingest = ingest
        self.tail_interval = tail_interval
        self.positions: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) -> offset of the next line
        self._load()

    @classmethod
    def from_config(cls, config: CollectorConfig, ingest: Callable[[bytes], Awaitable[object]]) -> Tailer:
        """``--tail``'s files, their read positions kept in the data directory."""
        return cls(config.tail, config.data_dir / STATE_FILE, ingest, tail_interval=config.tail_interval)

    def _load(self) -> None:
        try:
            saved = orjson.loads(self.state_path.read_bytes())
            self.positions = {(int(d), int(i)): int(off) for d, i, off in saved["files"]}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("tail_state_unreadable", path=str(self.state_path), error=str(exc))

    def _save(self) -> None:
        data = orjson.dumps({"files": [[d, i, off] for (d, i), off in self.positions.items()]})
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.state_path)

    def _files(self) -> list[tuple[float, str, tuple[int, int], int]]:
        """(mtime, path, identity, size) of every matching regular file, oldest first."""
        found = {}
        for pattern in self.patterns:
            for path in glob.glob(pattern):
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if os.path.isfile(path):
                    found[(st.st_dev, st.st_ino)] = (st.st_mtime, path, (st.st_dev, st.st_ino), st.st_size)
        return sorted(found.values())

    @staticmethod
    def _read(path: str, offset: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(CHUNK_BYTES)

    async def poll(self) -> int:
        """One pass over the files; returns how many bytes were consumed."""
        files = self._files()
        live = {ident for _, _, ident, _ in files}
        for ident in [i for i in self.positions if i not in live]:
            del self.positions[ident]
        consumed = 0
        loop = asyncio.get_running_loop()
        for _, path, ident, size in files:
            offset = self.positions.get(ident, 0)
            if size < offset:  # truncated in place
                offset = 0
            while offset < size:
                try:
                    chunk = await loop.run_in_executor(None, self._read, path, offset)
                except OSError:
                    break
                end = chunk.rfind(b"\n") + 1
                if end == 0:
                    if len(chunk) < CHUNK_BYTES:
                        break  # a line still being written
                    logger.warning("tail_line_too_long", path=path, offset=offset, limit=CHUNK_BYTES)
                    end = len(chunk)  # one line longer than the chunk: skip it
                else:
                    lines, record_errors = translate_lines(chunk[:end])  # engines' per-request records
                    for error in record_errors:
                        logger.warning("tail_record_unreadable", path=path, error=error)
                    try:
                        await self.ingest(lines)
                    except StoreError as exc:
                        logger.warning("tail_store_failed", path=path, error=str(exc))
                        self.positions[ident] = offset
                        return consumed
                    except IngestError:
                        pass  # nothing valid in these lines: counted as rejected, move on
                offset += end
                consumed += end
                self.positions[ident] = offset
                self._save()
            self.positions[ident] = offset
        return consumed

    async def run(self) -> None:
        while True:
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep following whatever one pass met
                logger.warning("tail_failed", error=str(exc))
            await asyncio.sleep(self.tail_interval)
