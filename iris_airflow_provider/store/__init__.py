"""The store: the single source of truth for federation state, in its own database (SQLAlchemy
Core, Alembic). Every state change is a conditional write.
"""
