"""``python -m hopline.collector --data-dir DIR ...`` runs ``hopline collector``."""

from hopline.collector.cli import main

main()
