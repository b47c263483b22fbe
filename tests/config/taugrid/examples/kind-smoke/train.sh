#!/bin/sh
echo stub
