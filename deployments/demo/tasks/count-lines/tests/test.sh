#!/bin/bash
python3 - <<'PY'
from pathlib import Path
want = len(Path("/app/data.txt").read_text().splitlines())
got = Path("/app/count.txt").read_text().strip() if Path("/app/count.txt").is_file() else None
Path("/logs/verifier/reward.txt").write_text("1" if got == str(want) else "0")
print(f"count.txt says {got!r}, the file has {want} lines")
PY
