"""gunicorn settings for serving the example app from a checkout:

    gunicorn -c gunicorn.conf.py example_app:app

The settings ship in the package (flask_animegan/gunicorn_conf.py), so a site that
installed it with pip serves the same way without this file:

    gunicorn -c python:flask_animegan.gunicorn_conf yourapp:app

ANIMEGAN_SERVER_THREADS, ANIMEGAN_ACCESS_LOG and ANIMEGAN_CONTROL_SOCKET come from the
environment (docs/configuration.md); gunicorn's own flags (-b, -w, --threads, --timeout,
--log-level) or GUNICORN_CMD_ARGS set the rest. To change one for this checkout only, set
it below the import.
"""

from flask_animegan.gunicorn_conf import *  # the settings and the hooks
