"""The router's operations on its HTTP front: the admin routes (`admin`: role switches, the
instances and their changes), the runtime controls (`admin_controls`: controller, cluster mode,
link caps, built-in load), and the series they add to /metrics (`controller_metrics`,
`controller_leader_metrics`, `scale_metrics`, `disagg_decisions`).

Each is an app extension (`minipd.api.app.Extension`) that the command line passes to
`start_api`; the serving API imports none of them.
"""
