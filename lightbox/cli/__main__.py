"""``python -m lightbox.cli``: the ``lightbox`` command."""

from lightbox.cli import main

main()
