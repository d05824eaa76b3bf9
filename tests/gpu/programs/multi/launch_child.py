"""A launcher that starts a training script as a plain subprocess (not multiprocessing, not a DataLoader)
and waits for it."""

import os
import subprocess
import sys
from pathlib import Path

here = Path(__file__).parent
env = {**os.environ, "CHILD_HOLD_S": "5"}
code = subprocess.run([sys.executable, str(here / "child_stray.py")], env=env).returncode
sys.exit(code)
