"""gradsift's lab: the command line, training loop, data-parallel launcher, studies,
benchmarks, model zoo and datasets. Built only on the library's public names; the
library never imports it."""
