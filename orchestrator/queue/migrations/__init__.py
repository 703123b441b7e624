"""The database's migrations (Alembic): ``versions/NNNN_slug.py``, one per schema change,
in a line (each ``down_revision`` is the one before). ``orchestrator.queue.schema`` runs
them (``gridshift db upgrade``) and creates a new database at the newest directly.

To change the schema:

1. change ``orchestrator/queue/models.py``;
2. ``python -m orchestrator.queue.schema revision "what changes"``: writes the next
   ``versions/NNNN_what_changes.py`` from the difference between the models and a database
   built by the migrations so far (Alembic's autogenerate);
3. read it and finish it: autogenerate misses renames and data changes, and an existing
   row needs a value for every new NOT NULL column (``server_default``). SQLite alters
   tables in batch mode (``op.batch_alter_table``: copy, drop, rename), which ``env.py``
   turns on;
4. ``tests/test_migrations.py`` checks the models and the migrations agree on both
   backends and that filled databases of earlier versions upgrade with every row intact.

Never edit a migration that has shipped: a database records which ones it ran.
"""
