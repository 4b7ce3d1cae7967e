"""What tests share: the model zoo, and helpers more than one test module uses (each module named
after what it defines).  Benchmarks import the zoo from here too, with the repository root on
``sys.path``; nothing here is a test."""
