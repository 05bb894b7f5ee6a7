#!/bin/bash
cd /app
python3 - <<'PY'
import json
cases = [((2, 3), 5), ((-1, 1), 0), ((10, 5), 15)]
try:
    import calc
    passed = sum(calc.add(*args) == want for args, want in cases)
except Exception as e:
    print("calc could not be used:", e)
    passed = 0
json.dump({"reward": 1.0 if passed == len(cases) else 0.0, "cases_passed": passed, "cases": len(cases)},
          open("/logs/verifier/reward.json", "w"))
print(f"{passed}/{len(cases)} cases pass")
PY
