"""``python -m iris_airflow_provider.cli``."""

import sys

from iris_airflow_provider.cli import main

sys.exit(main())
