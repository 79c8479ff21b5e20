import sys

from vgpuvirt.cli import main

sys.exit(main())
