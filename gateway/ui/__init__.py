"""The dashboard the gateway serves (docs/dashboard.md): server-rendered
pages, a little JavaScript (static/ui.js), live updates by server-sent
events, and ``/docs`` with its assets served locally."""
