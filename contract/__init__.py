"""The ground floor: what a model and an engine are (../shared/spec/ENGINE_CONTRACT.md).

  model_config  the config (the contract's model_config.json or a Hugging Face config.json),
                validated, and the derived configs the gate judges a program on
  families/     each model family in one module: the config it implies, the feature the
                gate probes, the weights it adds, where its reference math and seed genes live
  layout        every tensor's name and shape, and the Hugging Face name of each
  checkpoint    a checkpoint's files read into that layout
  loader        an engine file imported, and its id (the hash of its source)
  devices       device names as the contract passes them; cores and GPU clocks

Every other package imports this one; it imports none of them (tests/test_import_layers.py).
Engine files import nothing from the repository, this package included.
"""
