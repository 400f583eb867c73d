"""zoo model plugin: rl (being written)."""

import zoo


@zoo.hookimpl
def zoo_register_models(register):
    pass
