package probe

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

func hostChecks() []check {
	return []check{
		{"C1", "engine sockets", "find S_IFSOCK files; HTTP /_ping on known engine sockets; engine names in /proc/net/unix", checkSockets},
		{"C2", "leaked fds / cwd", "fstat every /proc/self/fd/* and cwd against the path it claims", checkFDs},
		{"C3", "host mounts", "parse mountinfo: unexpected bind mounts, rw /proc or /sys, shared propagation", checkHostMounts},
		{"C4", "secrets visible", "env, /proc/*/environ, .ssh, .git-credentials, .kube, docker config, service-account tokens", checkSecrets},
	}
}

// skipWalk are trees the socket and secret walks never enter.
var skipWalk = map[string]bool{"/proc": true, "/sys": true, "/dev": true}

func checkSockets(ctx context.Context, _ Params, c *Check) {
	var socks []string
	deadline := time.Now().Add(10 * time.Second)
	filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && skipWalk[p] || time.Now().After(deadline) {
			return fs.SkipDir
		}
		if d.Type()&fs.ModeSocket != 0 {
			socks = append(socks, p)
		}
		return nil
	})
	for _, p := range []string{"/run/podman/podman.sock", "/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"} {
		if _, err := os.Lstat(p); err == nil && !slices.Contains(socks, p) {
			socks = append(socks, p)
		}
	}
	if m, _ := filepath.Glob("/run/user/*/podman/podman.sock"); len(m) > 0 {
		socks = append(socks, m...)
	}
	c.Observed = fmt.Sprintf("%d unix sockets on the filesystem", len(socks))
	for _, s := range socks {
		engine := strings.Contains(s, "podman") || strings.Contains(s, "docker") || strings.Contains(s, "containerd")
		conn, err := net.DialTimeout("unix", s, time.Second)
		if err != nil {
			if engine {
				c.escape("container engine socket %s is in the cage (connect: %s)", s, errnoName(err))
			} else {
				c.ev("%s: connect %s", s, errnoName(err))
			}
			continue
		}
		conn.Close()
		cl := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", s)
		}}}
		if resp, err := cl.Get("http://d/_ping"); err == nil {
			resp.Body.Close()
			c.escape("%s answers HTTP /_ping with %s (a container engine API)", s, resp.Status)
			continue
		}
		c.escape("%s accepts connections", s)
	}
	if b, err := os.ReadFile("/proc/net/unix"); err == nil && strings.Contains(string(b), "@/containerd-shim") {
		c.escape("containerd-shim abstract socket visible")
	}
	c.settle(Sealed, "")
}

func checkFDs(_ context.Context, _ Params, c *Check) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		c.Verdict, c.Reason = Error, err.Error()
		return
	}
	var seen []string
	try := func(name, link string, st unix.Stat_t) {
		seen = append(seen, name+"→"+link)
		if !strings.HasPrefix(link, "/") {
			return // pipe:, socket:, anon_inode:
		}
		var pst unix.Stat_t
		if err := unix.Stat(link, &pst); err != nil || pst.Dev != st.Dev || pst.Ino != st.Ino {
			c.escape("%s points at %s, which is not that file in the cage (a host file descriptor)", name, link)
		}
	}
	for _, e := range ents {
		p := "/proc/self/fd/" + e.Name()
		link, err := os.Readlink(p)
		if err != nil {
			continue // the directory fd of ReadDir itself
		}
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil {
			continue
		}
		try("fd "+e.Name(), link, st)
	}
	if link, err := os.Readlink("/proc/self/cwd"); err == nil {
		var st unix.Stat_t
		if unix.Stat("/proc/self/cwd", &st) == nil {
			try("cwd", link, st)
		}
	}
	c.Observed = strings.Join(seen, " ")
	c.settle(Sealed, "")
}

// sanctionedBinds are the only places a cage may see host files: the
// worktree and its git metadata, HOME (a volume), the outbox, shrooms'
// own binary, podman's per-container files and the read-only git system
// config shrooms writes (safe.directory for /work).
var sanctionedBinds = []string{"/work", "/home/agent", "/outbox", "/.shrooms", "/etc/gitconfig", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/run/.containerenv", "/run/secrets", "/dev/shm", "/dev/mqueue"}

// pseudoFS never carry host files.
var pseudoFS = map[string]bool{"proc": true, "sysfs": true, "tmpfs": true, "devpts": true, "mqueue": true, "cgroup": true, "cgroup2": true, "overlay": true, "securityfs": true, "devtmpfs": true}

func checkHostMounts(_ context.Context, p Params, c *Check) {
	ms, err := mountTable()
	if err != nil {
		c.Verdict, c.Reason = Error, err.Error()
		return
	}
	gv := sentry(p)
	for _, m := range ms {
		if strings.Contains(m.optional, "shared:") {
			c.escape("%s has shared propagation (%s)", m.point, m.optional)
		}
		if (m.point == "/proc" || strings.HasPrefix(m.point, "/proc/")) && m.fstype == "proc" && m.point != "/proc" && hasOpt(m.opts, "rw") {
			c.escape("%s is rw", m.point)
		}
		if (m.point == "/sys" || strings.HasPrefix(m.point, "/sys/")) && hasOpt(m.opts, "rw") && m.fstype != "tmpfs" {
			if gv && m.fstype == "cgroup" && strings.HasPrefix(m.point, "/sys/fs/cgroup/") {
				sentryCgroup(c, m.point)
			} else {
				c.escape("%s (%s) is rw", m.point, m.fstype)
			}
		}
		if pseudoFS[m.fstype] || m.point == "/" {
			continue
		}
		if gv && m.point == "/dev" && m.fstype == "dev" && m.source == "none" && m.root == "/" {
			// gVisor's devtmpfs: the Sentry's own device files (B6).
			c.ev("/dev ← none:/ (dev): the Sentry's devtmpfs")
			continue
		}
		if m.point == "/etc/gitconfig" && hasOpt(m.opts, "rw") {
			c.escape("/etc/gitconfig is rw: a turn could point git at config of its own")
		}
		if underAny(m.point, sanctionedBinds) {
			c.ev("%s ← %s:%s (%s) sanctioned", m.point, m.source, m.root, m.fstype)
			continue
		}
		c.escape("host %s %s:%s is mounted at %s", m.fstype, m.source, m.root, m.point)
	}
	c.Observed = fmt.Sprintf("%d mounts", len(ms))
	c.settle(Sealed, "")
}

var secretWords = []string{"TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "APIKEY", "ACCESS_KEY", "PRIVATE_KEY", "CREDENTIAL", "AUTH"}

func secretName(k string) bool {
	u := strings.ToUpper(k)
	for _, w := range secretWords {
		if strings.Contains(u, w) {
			return true
		}
	}
	return false
}

func checkSecrets(_ context.Context, p Params, c *Check) {
	injected := map[string]bool{}
	for _, e := range p.SecretEnv {
		injected[e] = true
	}
	var names []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		names = append(names, k)
		if secretName(k) && !injected[k] {
			c.escape("environment variable %s looks like a secret that was not deliberately injected", k)
		}
	}
	c.Observed = "env: " + strings.Join(names, " ")
	me := os.Getpid()
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, pd := range procs {
		if pd == fmt.Sprintf("/proc/%d", me) {
			continue
		}
		b, err := os.ReadFile(pd + "/environ")
		if err != nil || len(b) == 0 {
			continue
		}
		for _, kv := range strings.Split(string(b), "\x00") {
			k, _, _ := strings.Cut(kv, "=")
			if k != "" && secretName(k) && !injected[k] {
				c.escape("%s/environ has %s", pd, k)
			}
		}
	}
	// Known credential files anywhere a host directory could surface,
	// outside the task's own HOME (whose keep-list is deliberate).
	roots := []string{"/root", "/etc", "/var/run/secrets", "/run/secrets", "/mnt", "/media", "/host", "/srv", "/opt"}
	if ms, err := mountTable(); err == nil {
		for _, m := range ms {
			if !pseudoFS[m.fstype] && m.point != "/" && !underAny(m.point, sanctionedBinds) {
				roots = append(roots, m.point)
			}
		}
	}
	names2 := map[string]bool{"id_rsa": true, "id_ed25519": true, "id_ecdsa": true, ".git-credentials": true, "config.json": true, "token": true, ".netrc": true, "kubeconfig": true, "credentials": true, ".pgpass": true}
	for _, r := range roots {
		n := 0
		filepath.WalkDir(r, func(pth string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if n++; n > 20000 {
				return fs.SkipAll
			}
			if !d.IsDir() && (names2[d.Name()] || strings.Contains(pth, "/.ssh/") || strings.Contains(pth, "/.kube/")) {
				if fd, err := unix.Open(pth, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
					unix.Close(fd)
					c.escape("readable credential file %s", pth)
				}
			}
			return nil
		})
	}
	c.settle(Sealed, "")
}
