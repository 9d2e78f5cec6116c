"""``hops up``'s state file (``<data-dir>/up.json``) is replaced whole,
never rewritten in place: ``hops auth`` and the fault tests read it while
``hops up`` writes it again (nats-server restarted), and a reader of a file
truncated in place read an empty document."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from cli.up.stack import StackConfig
from cli.up.up import _write_state
from services.runtime.natscluster import NatsCluster


def test_the_state_file_is_replaced_whole(tmp_path: Path) -> None:
    config = StackConfig(data_dir=tmp_path)
    nats = NatsCluster(tmp_path / "nats", 1, ports=[4222])  # not started: its URL and no pid
    _write_state(config, nats, [])
    with config.state_file.open() as reader:  # a reader holding the first version
        _write_state(config, nats, [])  # hops up writes it again meanwhile
        # a new file took the name: the reader's was never truncated under it
        assert os.fstat(reader.fileno()).st_ino != config.state_file.stat().st_ino
        first = json.loads(reader.read())
    assert first["nats"]["url"] == nats.urls[0] and first["components"] == {}
    assert json.loads(config.state_file.read_text()) == first
    assert stat.S_IMODE(config.state_file.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".up.json")] == []
