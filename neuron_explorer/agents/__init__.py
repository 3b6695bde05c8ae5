"""Profiles for coding agents: an MCP server whose tools answer with the web's /api/ documents
(server.py, tools.py), and the report an agent or a person pastes into a pull request
(report.py). This package sits on top, beside web/; nothing below imports it."""
