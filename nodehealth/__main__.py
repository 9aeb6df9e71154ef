import sys

from nodehealth.cli import main

sys.exit(main())
