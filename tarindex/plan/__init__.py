"""Pure seeded planning, no data read and no torch: one module per planner.

``seeds`` (one generator per use), ``blocks`` (block tables), ``epoch`` (an epoch's plan dealt
to ranks and workers), ``resume`` (what is left of an epoch, over another world size), ``mix``
(mixing schedules), ``split`` (stable key splits).
"""
