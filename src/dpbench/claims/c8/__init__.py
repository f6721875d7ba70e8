"""C8, DataParallel makes training faster: the speed-up verdict from the runs, its text and figures."""
