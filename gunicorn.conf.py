"""gunicorn settings for serving the example app from a checkout:

    gunicorn -c gunicorn.conf.py example_app:app

The settings ship in the package (flask_animegan/gunicorn_conf.py), so a site that
installed it with pip serves the same way without this file:

    gunicorn -c python:flask_animegan.gunicorn_conf yourapp:app

Every value can be set from the environment (ANIMEGAN_BIND, ANIMEGAN_WORKERS,
ANIMEGAN_THREADS, ANIMEGAN_WORKER_TIMEOUT, ANIMEGAN_GRACEFUL_TIMEOUT,
ANIMEGAN_ACCESS_LOG, ANIMEGAN_LOG_LEVEL, ANIMEGAN_CONTROL_SOCKET; the module has the
full list and the reasons); gunicorn's own flags (-b, -w, --threads) override them.
To change one for this checkout only, set it below the import.
"""

from flask_animegan.gunicorn_conf import *  # the settings and the hooks
