#!/bin/bash
python3 - <<'PY'
from pathlib import Path
ok = Path("/app/hello.txt").is_file() and Path("/app/hello.txt").read_text().strip() == "Hello, world!"
Path("/logs/verifier/reward.txt").write_text("1\n" if ok else "0\n")
print("hello.txt is right" if ok else "hello.txt is missing or wrong")
PY
