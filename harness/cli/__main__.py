"""`python -m harness.cli`: the same as `pcgh`."""

from harness.cli import main

raise SystemExit(main())
