"""The local vLLM server wrapper's file handling, without starting a server."""

from __future__ import annotations

import sys

import pytest

from schedport.errors import SchedportError
from schedport.realengine.localserver import ADMISSION_LOG_HEADER, VllmCpuServer


def _server(tmp_path) -> VllmCpuServer:
    # any existing interpreter passes the lookup; nothing here launches it
    return VllmCpuServer(tmp_path / "model", python=sys.executable, log_path=tmp_path / "server.log",
                         record_admissions=True)


def test_a_users_file_at_the_admissions_path_is_refused_and_kept(tmp_path):
    srv = _server(tmp_path)
    srv.admission_log.write_text("my notes\n")
    with pytest.raises(SchedportError, match="not a schedport admissions log; refusing to overwrite"):
        srv.start()
    assert srv.admission_log.read_text() == "my notes\n" and srv.proc is None


def test_its_own_admissions_log_is_restarted_empty(tmp_path):
    srv = _server(tmp_path)
    srv.admission_log.write_text(f"{ADMISSION_LOG_HEADER}\n1\tadded\tr0\t1.5\t3\n2\tscheduled\tr0\n")
    assert srv.admissions() == [("added", "r0", 1.5, 3), ("scheduled", "r0")]
    srv._fresh_admission_log()
    assert srv.admission_log.read_text() == ADMISSION_LOG_HEADER + "\n" and srv.admissions() == []
