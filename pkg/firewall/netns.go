package firewall

import "github.com/shrooms-cage/shrooms/pkg/innetns"

// inNetNS runs fn in the network namespace at path ("" where we are).
func inNetNS(path string, fn func() error) error { return innetns.Run(path, fn) }
