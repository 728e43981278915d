import sys

from sonic_jax.bench.cli import main

sys.exit(main())
