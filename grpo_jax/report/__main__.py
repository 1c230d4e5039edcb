"""``python -m grpo_jax.report DIR [--out OUT] [--collect_into OUT]`` (`cli.main`)."""

import sys

from grpo_jax.report.cli import main

sys.exit(main())
