import os
import sys

if os.environ.get("MESHRUN_RANK_DIES_WITH_PARENT"):  # see launcher.backends.process_lifetime
    from training.preemption import die_with_parent

    die_with_parent()

from training.main import main  # noqa: E402

sys.exit(main())
