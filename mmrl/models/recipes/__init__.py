"""How the embedded models were made: their recipes (tokenizer, architecture, pre-training), the command that runs a
recipe again (`build`) and the one that adds a built model to the package (`ship`). The loader (mmrl/models/loading.py,
shipped.py) reads only the shipped files and imports nothing here; the recipes use the tasks and the command line."""
