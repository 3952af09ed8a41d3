"""The chat page: an opt-in view a host project mounts (``include("streamrecover.chat.urls")``)
and restyles (its templates are ``streamrecover/chat/base.html`` and ``streamrecover/chat/chat.html``).

Its form posts: without JavaScript the POST creates the run and redirects to the thread's page,
which shows the committed messages and reloads itself while the run is active; with JavaScript
(``static/streamrecover/chat.js``) the same POST answers JSON and the page follows the run live
over its WebSocket. Subclass ``ChatView`` to add run options (``run_options``), page config
(``get_config``), the empty form's initial values (``get_initial``) or a login URL; the demo
project does, for its fault chooser.
"""
