"""``python -m gradsift`` runs the command line (also what ``torchrun -m gradsift`` uses)."""

import sys

from gradsift.lab.cli import main

sys.exit(main())
