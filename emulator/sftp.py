"""SFTP for an emulated TPU host: real files; relative paths start in the host's HOME.

Absolute paths are used as given, as on a VM where the client may write anywhere it may;
relative ones resolve against the host's sandbox directory, as OpenSSH resolves them
against the login user's home.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import paramiko
from paramiko.sftp import SFTP_OK


def _errno(exc: OSError) -> int:
    return paramiko.SFTPServer.convert_errno(exc.errno)


class _Handle(paramiko.SFTPHandle):
    def stat(self) -> paramiko.SFTPAttributes | int:
        try:
            return paramiko.SFTPAttributes.from_stat(os.fstat(self.readfile.fileno()))
        except OSError as exc:
            return _errno(exc)

    def chattr(self, attr: paramiko.SFTPAttributes) -> int:
        try:
            paramiko.SFTPServer.set_file_attr(self.filename, attr)
            return SFTP_OK
        except OSError as exc:
            return _errno(exc)


class SandboxSFTP(paramiko.SFTPServerInterface):
    """Serves the real file system; `server.home` (set by the host) anchors relative paths."""

    def __init__(self, server: paramiko.ServerInterface, *args, **kwargs) -> None:
        super().__init__(server, *args, **kwargs)
        self.home: str = server.home  # type: ignore[attr-defined]

    def _path(self, path: str) -> str:
        return os.path.normpath(os.path.join(self.home, path))

    def canonicalize(self, path: str) -> str:
        return self._path(path)

    def list_folder(self, path: str) -> list[paramiko.SFTPAttributes] | int:
        path = self._path(path)
        try:
            out = []
            for name in os.listdir(path):
                attr = paramiko.SFTPAttributes.from_stat(os.lstat(os.path.join(path, name)))
                attr.filename = name
                out.append(attr)
            return out
        except OSError as exc:
            return _errno(exc)

    def stat(self, path: str) -> paramiko.SFTPAttributes | int:
        try:
            return paramiko.SFTPAttributes.from_stat(os.stat(self._path(path)))
        except OSError as exc:
            return _errno(exc)

    def lstat(self, path: str) -> paramiko.SFTPAttributes | int:
        try:
            return paramiko.SFTPAttributes.from_stat(os.lstat(self._path(path)))
        except OSError as exc:
            return _errno(exc)

    def open(self, path: str, flags: int, attr: paramiko.SFTPAttributes | None) -> _Handle | int:
        path = self._path(path)
        try:
            binary = getattr(os, "O_BINARY", 0)
            mode = attr.st_mode if attr is not None and attr.st_mode is not None else 0o666
            fd = os.open(path, flags | binary, mode & 0o7777)
        except OSError as exc:
            return _errno(exc)
        if flags & os.O_CREAT and attr is not None:
            attr._flags &= ~attr.FLAG_PERMISSIONS
            paramiko.SFTPServer.set_file_attr(path, attr)
        if flags & os.O_WRONLY:
            fstr = "ab" if flags & os.O_APPEND else "wb"
        elif flags & os.O_RDWR:
            fstr = "a+b" if flags & os.O_APPEND else "r+b"
        else:
            fstr = "rb"
        try:
            f = os.fdopen(fd, fstr)
        except OSError as exc:
            return _errno(exc)
        handle = _Handle(flags)
        handle.filename = path
        handle.readfile = f
        handle.writefile = f
        return handle

    def _simple(self, fn: Callable[..., None], *paths: str) -> int:
        try:
            fn(*[self._path(p) for p in paths])
            return SFTP_OK
        except OSError as exc:
            return _errno(exc)

    def remove(self, path: str) -> int:
        return self._simple(os.remove, path)

    def rename(self, oldpath: str, newpath: str) -> int:
        return self._simple(os.rename, oldpath, newpath)

    def posix_rename(self, oldpath: str, newpath: str) -> int:
        return self._simple(os.replace, oldpath, newpath)

    def rmdir(self, path: str) -> int:
        return self._simple(os.rmdir, path)

    def mkdir(self, path: str, attr: paramiko.SFTPAttributes | None) -> int:
        try:
            path = self._path(path)
            os.mkdir(path)
            if attr is not None:
                paramiko.SFTPServer.set_file_attr(path, attr)
            return SFTP_OK
        except OSError as exc:
            return _errno(exc)

    def chattr(self, path: str, attr: paramiko.SFTPAttributes) -> int:
        try:
            paramiko.SFTPServer.set_file_attr(self._path(path), attr)
            return SFTP_OK
        except OSError as exc:
            return _errno(exc)

    def symlink(self, target_path: str, path: str) -> int:
        try:
            os.symlink(target_path, self._path(path))
            return SFTP_OK
        except OSError as exc:
            return _errno(exc)

    def readlink(self, path: str) -> str | int:
        try:
            return os.readlink(self._path(path))
        except OSError as exc:
            return _errno(exc)
