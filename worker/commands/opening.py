"""What every `actonce` command opens first: its settings, and a runtime checked to fit.

A command that cannot start says why in one line (a `click.ClickException`), naming the value to
change, rather than failing later with a traceback.
"""

import click

from actonce.worker.definition import DefinitionError, load_definition
from actonce.worker.process.runtime import Runtime, StoresNotMigrated
from actonce.worker.settings import Settings, SettingsError
from actonce.worker.storage.unreachable import StoreUnreachable


def settings_for(app: str | None) -> Settings:
    """Return the settings from `ACTONCE_*`, with `--app` over `ACTONCE_APP` when given.

    Raises:
        click.ClickException: If the settings are invalid; it names the variable.
    """
    try:
        return Settings.from_env(None, **({"app": app} if app else {}))
    except SettingsError as invalid:
        raise click.ClickException(str(invalid)) from invalid


def open_runtime(settings: Settings) -> Runtime:
    """Return an opened runtime over migrated stores, for a command; the caller closes it.

    Raises:
        click.ClickException: If the definition cannot be loaded or does not fit the stores, or
            a store was never migrated or cannot be used.
    """
    try:
        return Runtime(settings, load_definition(settings.app), one_run=False).open(check=True)
    except (DefinitionError, StoresNotMigrated, StoreUnreachable) as unfit:
        raise click.ClickException(str(unfit)) from unfit
