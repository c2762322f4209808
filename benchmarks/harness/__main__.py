"""``python benchmarks/harness render RESULT.json [--table N]``: a run's
tables as markdown (`results.render`)."""

import sys
from pathlib import Path

# Run as a folder, this one is first on sys.path: import the package from
# its parent instead.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from harness.results import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
