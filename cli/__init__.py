"""petal's command line (click). Heavy imports happen inside commands, so ``petal --help`` is instant."""
