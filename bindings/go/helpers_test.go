package dlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A store the tests run against: file:// in a temporary directory, and
// every store whose URI is in the environment. A missing one is skipped,
// or fails under DLOCK_STORES_REQUIRED=1.
type store struct{ label, env, uri string }

var networked = []store{
	{"redis", "DLOCK_REDIS_URI", ""},
	{"redlock", "DLOCK_REDLOCK_URI", ""},
	{"redis-tls", "DLOCK_REDIS_TLS_URI", ""}, // rediss://: TLS, the ACL user
	{"postgres", "DLOCK_POSTGRES_URI", ""},
	{"mysql", "DLOCK_MYSQL_URI", ""},
	{"zookeeper", "DLOCK_ZK_URI", ""},
	{"etcd", "DLOCK_ETCD_URI", ""},
}

var fileDir string

func TestMain(m *testing.M) {
	if role := os.Getenv("DLOCK_GO_CHILD"); role != "" {
		os.Exit(child(role))
	}
	dir, err := os.MkdirTemp("", "dlock-go-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fileDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func stores() []store {
	list := []store{{"file", "", "file://" + fileDir}}
	for _, s := range networked {
		s.uri = os.Getenv(s.env)
		list = append(list, s)
	}
	return list
}

// forStores runs fn as a subtest per store.
func forStores(t *testing.T, fn func(t *testing.T, st store)) {
	for _, st := range stores() {
		st := st
		t.Run(st.label, func(t *testing.T) {
			if st.uri == "" {
				if os.Getenv("DLOCK_STORES_REQUIRED") == "1" {
					t.Fatalf("%s must be set (DLOCK_STORES_REQUIRED=1)", st.env)
				}
				t.Skipf("%s is not set", st.env)
			}
			fn(t, st)
		})
	}
}

func openT(t *testing.T, uri string) *Client {
	t.Helper()
	c, err := Open(uri)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var (
	seq atomic.Int64
	run = fmt.Sprintf("%d-%06x", os.Getpid(), rand.New(rand.NewSource(time.Now().UnixNano())).Intn(1<<24))
)

func lockName(what string) string {
	return fmt.Sprintf("go-%s-%s-%d", run, what, seq.Add(1))
}

// bounded is a context for one step, so that a wait that never ends fails.
func bounded(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t *testing.T, c *Client, name string, opts ...Option) *Lock {
	t.Helper()
	l, err := c.Acquire(bounded(t, 20*time.Second), name, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", name, err)
	}
	return l
}

// proxy forwards loopback connections to target until blackholed: then it
// keeps them open and drops every byte both ways (a silent network).
type proxy struct {
	ln    net.Listener
	hole  atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.DialTimeout("tcp", target, 2*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go p.pipe(c, s)
			go p.pipe(s, c)
		}
	}()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && !p.hole.Load() {
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF || !p.hole.Load() {
				to.Close()
			}
			return
		}
	}
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

// child is the test binary run again as another process (DLOCK_GO_CHILD).
func child(role string) int {
	uri, name := os.Getenv("DLOCK_GO_URI"), os.Getenv("DLOCK_GO_NAME")
	c, err := Open(uri)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch role {
	case "exclusion":
		out, err := os.OpenFile(os.Getenv("DLOCK_GO_OUT"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 2
		}
		defer out.Close()
		for i := 0; i < 5; i++ {
			l, err := c.Acquire(ctx, name)
			if err != nil {
				fmt.Fprintln(os.Stderr, "child: acquire:", err)
				return 1
			}
			fmt.Fprintf(out, "s %d %d\n", os.Getpid(), l.Token())
			time.Sleep(2 * time.Millisecond)
			fmt.Fprintf(out, "e %d %d\n", os.Getpid(), l.Token())
			if err := l.Release(); err != nil {
				fmt.Fprintln(os.Stderr, "child: release:", err)
				return 1
			}
		}
		return 0
	case "pause":
		l, err := c.Acquire(ctx, name, Keep(), WithTTL(600*time.Millisecond))
		if err != nil {
			fmt.Fprintln(os.Stderr, "child: acquire:", err)
			return 1
		}
		fmt.Printf("held %d\n", l.Token())
		select {
		case <-l.Lost():
			var e *Error
			if errors.As(l.Err(), &e) {
				fmt.Printf("lost %s\n", e.Code.Name())
			}
			l.Release()
			return 0
		case <-time.After(10 * time.Second):
			fmt.Println("never lost")
			return 1
		}
	}
	return 2
}
