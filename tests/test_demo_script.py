"""``make demo`` (scripts/demo.sh) on a port that something else already listens on."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_make_demo_on_a_port_in_use_says_so_and_fails_instead_of_printing_the_other_servers_address() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "DEMO_PORT": str(port), "DEMO_HOST": "127.0.0.1"}
        done = subprocess.run(
            ["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode != 0
    assert f"127.0.0.1:{port} is in use" in done.stderr
    assert f"DEMO_PORT={port + 1} make demo" in done.stderr
    assert "demo chat:" not in done.stdout  # no address that would lead to the other server
