"""``python -m fsdpviz``: the same as the ``fsdpviz`` command."""

from fsdpviz.cli import main

raise SystemExit(main())
