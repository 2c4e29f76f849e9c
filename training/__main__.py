import sys

from training.main import main

sys.exit(main())
