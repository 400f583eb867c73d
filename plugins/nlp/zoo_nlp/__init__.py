"""zoo model plugin: nlp (being written)."""

import zoo


@zoo.hookimpl
def zoo_register_models(register):
    pass
