"""The ``cuvil`` subcommands beyond compile and run, one module each.

A command module defines ``register(sub)``, which adds its parser to the command line and sets
``fn`` to the function that runs it (returning the exit status; a ``CuvilError`` is a usage or
input error, exit status 2). ``cuvil.cli.COMMANDS`` lists the modules, in the order ``--help``
shows them.
"""
