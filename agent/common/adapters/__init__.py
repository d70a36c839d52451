"""The shared adapters: the Kubernetes client (`kube`, `kube_http`, `informer`) and the HTTP
server of /metrics and the health checks (`endpoints`, `bounded_http`), for all three programs."""
