"""The social world's OpenEnv server: ``uvicorn server.app:app --port 8000`` (what the Dockerfile runs), or
``python -m server.app`` / the ``server`` script. Every shipped scenario; 16 sessions at once.
``SOCIALWORLD_SCRIPTED=1`` lets a step ask the expert or the oracle for its reply (the baseline script's
scores; never on a server a policy trains against: the oracle reads hidden state)."""

import os

from socialworld.rollout.openenv import make_app

app = make_app(max_sessions=int(os.environ.get("SOCIALWORLD_MAX_SESSIONS", "16")),
               scripted=os.environ.get("SOCIALWORLD_SCRIPTED", "") == "1")


def main() -> None:
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
