"""C7, cudnn.benchmark under DataParallel: the probe (with the DataParallel step breakdown), the verdict, its text and figure."""
