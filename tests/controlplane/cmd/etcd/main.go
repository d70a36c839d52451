// Command etcd is the etcd server from the same module graph as kube-apiserver,
// so the test control plane needs no separately packaged etcd.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
